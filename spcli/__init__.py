__version__ = "0.1.0"
DISTRIBUTION = "specprefill-cli"  # the name on PyPI (`spcli` there is another project); the command is `spcli`
