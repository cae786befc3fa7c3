"""spcli on a Ray cluster: `spcli run --ray` (driver.py: a pool of actors, one engine each, a manifest per actor
slot) and a Ray Data processor for pipelines already in Ray Data (processor.py: `build_processor`).

Nothing here imports Ray until it is used: `pip install 'specprefill-cli[ray]'`.
"""


def build_processor(*args, **kwargs):
    """A Ray Data processor: dataset of records -> dataset of spcli output rows (spcli/ray/processor.py)."""
    from spcli.ray.processor import build_processor as build

    return build(*args, **kwargs)
