"""Built-in tasks: seeded, sized in tokens, needles and answers really in the prompt."""

import pytest

from spcli.models.files import load_tokenizer
from spcli.errors import ConfigError
from spcli.evaluate.tasks import TASKS, generate


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return load_tokenizer(smollm2_dir)


def prompt_len(tokenizer, ex) -> int:
    return len(tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False))


@pytest.mark.parametrize("task", TASKS)
def test_task_is_seeded_sized_and_answerable(tokenizer, task):
    a = generate(task, tokenizer, 1024, 2, seed=3)
    assert a == generate(task, tokenizer, 1024, 2, seed=3)
    assert [e.messages for e in a] != [e.messages for e in generate(task, tokenizer, 1024, 2, seed=4)]
    assert a[0].messages != a[1].messages
    for ex in a:
        assert 0.9 * 1024 <= prompt_len(tokenizer, ex) <= 1.1 * 1024
        text = ex.messages[-1]["content"]
        assert ex.answers and ex.needles
        for needle in ex.needles:
            assert text.count(needle) == 1
        for answer in ex.answers:
            assert any(answer in n for n in ex.needles)  # the answer is only where the needles are ...
        tail = text[-400:]
        assert not any(n in tail for n in ex.needles)  # ... and never in the forced tail


def test_needle_depths_spread_over_the_document(tokenizer):
    depths = [e.metadata["depths"][0] for e in generate("niah", tokenizer, 512, 12, seed=0)]
    assert min(depths) < 0.4 and max(depths) > 0.6


def test_unknown_task_and_bad_length_are_clear_errors(tokenizer):
    with pytest.raises(ConfigError, match="unknown task"):
        generate("nope", tokenizer, 1024, 1, 0)
    with pytest.raises(ConfigError, match="length"):
        generate("niah", tokenizer, 10, 1, 0)


def test_scatter_puts_one_value_in_each_slice_of_the_prompt(tokenizer):
    for ex in generate("niah-scatter", tokenizer, 2048, 3, seed=0):
        text = ex.messages[-1]["content"]
        at = [text.index(n) / len(text) for n in ex.needles]
        assert len(ex.answers) == len(set(ex.answers)) == 8 and ex.require_all
        assert at == sorted(at) and at[0] < 0.2 and at[-1] > 0.8
        assert all(0.05 < b - a < 0.25 for a, b in zip(at, at[1:]))  # spread out, not clustered


def test_needles_family_expands_and_needle_first_asks_before_the_document(tokenizer):
    from spcli.evaluate.tasks import expand_tasks

    assert expand_tasks(["niah", "needles", "needle-code"]) == ("niah", "needle-code", "needle-name", "needle-date",
                                                               "needle-first")
    for ex in generate("needle-first", tokenizer, 1024, 3, seed=0):
        text = ex.messages[-1]["content"]
        (instruction,) = ex.protected
        assert text.startswith(instruction) and "Question:" in instruction and text.index(ex.needles[0]) > len(instruction)
        assert "vault" not in text[text.index(ex.needles[0]) + len(ex.needles[0]):]  # nothing asked after the notes
    for ex in generate("needle-code", tokenizer, 1024, 4, seed=0):
        assert ex.needles[0].endswith(f" {ex.answers[0]}.") and not ex.protected  # the code ends its sentence
