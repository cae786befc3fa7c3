"""spcli/stages/tokenize.py: what the model reads of a record."""


def test_a_raw_prompt_with_an_instruction_reads_as_a_chat_message(tiny_dir):
    """An instruct model answers the instruction instead of continuing the document (issue 40): a prompt given
    with --instruction-field is one user message where the model has a chat template; without one it stays raw."""
    from transformers import AutoTokenizer

    from spcli.stages.tokenize import encode, tokenize
    from spcli.io.records import Record

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    text = "Which floor?\n\nThe printer on floor three jams on duplex pages."
    asked = Record(0, 0, "a", prompt=text, protected=("Which floor?",))
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    assert encode(asked, tok).text == chat
    assert tokenize(asked, tok, 1 << 20, "error") == encode(asked, tok).ids
    plain = Record(0, 0, "p", prompt=text)
    assert encode(plain, tok).text == text  # no instruction: raw text, as /v1/completions sends it
    tok.chat_template = None
    assert encode(asked, tok).text == text  # no template to read it with: raw
