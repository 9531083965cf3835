"""The user's own data in: the demo corpus as Parquet, a datasets folder, several files and chat
conversations gives the JSONL run's labels and order; outputs in the input's format or converted,
in shards; special tokens counted; one clear line for bad input in each format."""

import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import curate_dataset
from diversity_order.cli import run_main

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
DEMO = Path(__file__).parent.parent / "demo" / "stdlib.jsonl"
N_DEMO = 240


def curate(*args):
    return run_main(curate_dataset.main, [str(a) for a in args] + ["--no-progress", "--no-plot"])


def run_error(capsys, *args):
    code = curate(*args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def demo_records(tmp_path_factory):
    corpus = DEMO
    if not corpus.is_file():  # a clean checkout (CI): build the same corpus (seconds) rather than skip
        from diversity_order.demo_data import build_stdlib_corpus

        corpus = tmp_path_factory.mktemp("demo") / "stdlib.jsonl"
        build_stdlib_corpus(corpus)
    with corpus.open() as handle:
        return [json.loads(next(handle)) for _ in range(N_DEMO)]


@pytest.fixture()
def demo_jsonl(tmp_path, demo_records):
    path = tmp_path / "demo.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in demo_records))
    return path


@pytest.fixture()
def chat_model_dir(tiny_model_dir, tmp_path):
    """The tiny model with a small chat template of its own."""
    folder = tmp_path / "chat_model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}")
    return folder


def _same_run(a: Path, b: Path) -> None:
    for what in ("labels", "order"):
        np.testing.assert_array_equal(np.load(f"{a}_{what}.npy"), np.load(f"{b}_{what}.npy"), err_msg=what)


COMMON = ("--n-clusters", 8, "--seq-len", 4096)


def test_demo_in_every_format_gives_the_jsonl_runs_labels_and_order(tmp_path, demo_jsonl, demo_records,
                                                                     tiny_model_dir):
    datasets = pytest.importorskip("datasets")  # a dev extra (save_to_disk folders)

    assert curate("--input", demo_jsonl, "--output", tmp_path / "j" / "c.jsonl", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    # Parquet, several row groups; the same order written back as Parquet with the input's schema.
    parquet = tmp_path / "demo.parquet"
    pq.write_table(pa.Table.from_pylist(demo_records), parquet, row_group_size=50)
    assert curate("--input", parquet, "--output", tmp_path / "p" / "c.parquet", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    _same_run(tmp_path / "j" / "c", tmp_path / "p" / "c")
    order = np.load(tmp_path / "j" / "c_order.npy")
    out = pq.read_table(tmp_path / "p" / "c.parquet")
    assert out.schema.equals(pq.read_schema(parquet))
    assert out.to_pylist() == [demo_records[i] for i in order]
    # A save_to_disk folder of several Arrow files, written back as a folder load_from_disk opens.
    folder = tmp_path / "demo_ds"
    datasets.Dataset.from_list(demo_records).save_to_disk(str(folder), num_shards=3)
    assert curate("--input", folder, "--output", tmp_path / "d" / "c_ds", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    _same_run(tmp_path / "j" / "c", tmp_path / "d" / "c_ds")
    assert datasets.load_from_disk(str(tmp_path / "d" / "c_ds")).to_list() == [demo_records[i] for i in order]
    # Several Parquet files by a glob, converted to JSONL: the JSONL run's curated file, line for line.
    (tmp_path / "parts").mkdir()
    for i in range(3):
        pq.write_table(pa.Table.from_pylist(demo_records[80 * i: 80 * (i + 1)]), tmp_path / "parts" / f"p{i}.parquet")
    assert curate("--input", tmp_path / "parts" / "*.parquet", "--output", tmp_path / "g" / "c.jsonl",
                  "--model-dir", tiny_model_dir, *COMMON) == 0
    _same_run(tmp_path / "j" / "c", tmp_path / "g" / "c")
    got = [json.loads(line) for line in (tmp_path / "g" / "c.jsonl").read_text().splitlines()]
    assert got == [demo_records[i] for i in order]


def test_conversations_are_rendered_with_the_chat_template(tmp_path, demo_records, chat_model_dir, caplog):
    from diversity_order.tokenizer import DocumentTokenizer

    chats = [{"messages": [{"role": "user", "content": r["name"]}, {"role": "assistant", "content": r["text"]}]}
             for r in demo_records]
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps(c) + "\n" for c in chats))
    tokenizer = DocumentTokenizer(chat_model_dir)
    rendered = tmp_path / "rendered.jsonl"
    rendered.write_text("".join(json.dumps({"text": tokenizer.render_chat(c["messages"])}) + "\n" for c in chats))
    assert "<s>assistant\n" in tokenizer.render_chat(chats[0]["messages"])
    for name, path, field in (("c", chat, "messages"), ("r", rendered, "text")):
        assert curate("--input", path, "--text-field", field, "--output", tmp_path / name / "c.jsonl",
                      "--model-dir", chat_model_dir, *COMMON) == 0
    _same_run(tmp_path / "c" / "c", tmp_path / "r" / "c")
    meta_c = json.loads((tmp_path / "c" / "c_meta.json").read_text())
    meta_r = json.loads((tmp_path / "r" / "c_meta.json").read_text())
    assert meta_c["total_tokens"] == meta_r["total_tokens"]
    # the metadata names the template conversations went through; plain texts went through none
    where = Path(chat_model_dir) / ("chat_template.jinja" if (Path(chat_model_dir) / "chat_template.jinja").is_file()
                                    else "tokenizer_config.json")
    assert meta_c["chat_template"]["file"] == str(where) and len(meta_c["chat_template"]["blake2b"]) == 16
    assert meta_r["chat_template"] is None
    assert (tmp_path / "c" / "c.jsonl").read_bytes().splitlines() == [
        chat.read_bytes().splitlines()[i] for i in np.load(tmp_path / "c" / "c_order.npy")]
    # Without --model-dir (embeddings given, token counts from the cache) the template is not known: said, not null.
    assert curate("--input", chat, "--text-field", "messages", "--output", tmp_path / "e" / "c.jsonl",
                  "--load-embeddings", tmp_path / "c" / "c_embeddings.npy", *COMMON) == 0
    # Exported, conversations need no separator flag: the chat template ends each turn (a reviewer was told
    # otherwise); plain texts with none are warned of.
    with caplog.at_level(logging.WARNING):
        for name, path, field in (("xc", chat, "messages"), ("xr", rendered, "text")):
            assert curate("--input", path, "--text-field", field, "--output", tmp_path / name / "c.jsonl",
                          "--model-dir", chat_model_dir, "--packing", "split", "--export-packed",
                          tmp_path / name / "packed", *COMMON) == 0
            said = "concatenated with no token between them" in caplog.text
            assert said == (name == "xr"), name
    meta_e = json.loads((tmp_path / "e" / "c_meta.json").read_text())
    assert meta_e["chat_template"]["file"] is None and meta_e["chat_template"]["note"].startswith("not known: no --model-dir")
    assert meta_e["total_tokens"] == meta_c["total_tokens"]


def test_the_same_conversations_from_jsonl_and_parquet_share_their_caches(tmp_path, demo_records, chat_model_dir,
                                                                           caplog):
    """Tool calls in a few turns: the JSONL curated into Parquet (which holds those messages as JSON text, as
    datasets does) reads back as the same conversations, so its run reuses every cached row. A Parquet file written
    as one struct of every key gives each message the keys it lacks as null, which a trainer passes to the
    template as they are (a template printing them prints the nulls): those conversations are others, rendered
    with their nulls and counted again."""
    chats = []
    for i, r in enumerate(demo_records[:60]):
        turn = {"role": "assistant", "content": r["text"]}
        if i % 7 == 0:
            turn["tool_calls"] = [{"type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
            turn["name"] = "helper"
        chats.append({"id": i, "messages": [{"role": "user", "content": r["name"]}, turn]})
    jsonl, struct = tmp_path / "chat.jsonl", tmp_path / "struct.parquet"
    jsonl.write_text("".join(json.dumps(c) + "\n" for c in chats))
    pq.write_table(pa.Table.from_pylist(chats), struct)
    assert pq.read_table(struct).to_pylist()[1]["messages"][1]["tool_calls"] is None  # what that Parquet holds
    args = ["--text-field", "messages", "--model-dir", chat_model_dir, *COMMON]
    assert curate("--input", jsonl, "--output", tmp_path / "j" / "c.parquet", *args) == 0
    caplog.set_level(logging.INFO)
    assert curate("--input", tmp_path / "j" / "c.parquet", "--output", tmp_path / "p" / "c.jsonl", *args) == 0
    # Every conversation found in the JSONL run's caches (through the registry: the Parquet lies elsewhere).
    assert "60 row(s) taken from" in caplog.text and "chat_token_counts.messages.npy" in caplog.text
    assert "(tokenized once for counts and vectors)" not in caplog.text and "Embedding 60 record(s)" not in caplog.text
    caplog.clear()
    assert curate("--input", struct, "--output", tmp_path / "s" / "c.jsonl", *args) == 0
    assert "(tokenized once for counts and vectors)" in caplog.text
    # This template prints role and content only: the nulls change no token here.
    assert np.array_equal(np.load(tmp_path / "chat_token_counts.messages.npy"),
                          np.load(tmp_path / "struct_token_counts.messages.npy"))


def test_the_chat_renderer_loads_before_the_embedding_progress_starts(tmp_path, demo_records, chat_model_dir,
                                                                     monkeypatch):
    """Loading transformers' tokenizer takes seconds: done inside the first batch, the first progress line's rate
    and ETA counted it (a new user saw 'ETA 0:02:04' for an 8-second embedding). It loads before the progress
    starts where the text field holds conversations, and not at all for plain texts."""
    from diversity_order import embed
    from diversity_order.tokenizer import DocumentTokenizer

    events = []
    real_prepare, real_progress = DocumentTokenizer.prepare_chat, embed.Progress

    def prepare(self):
        events.append(("prepare", self._transformers_tokenizer is None))
        real_prepare(self)

    def progress(*args, **kwargs):
        events.append(("progress", None))
        return real_progress(*args, **kwargs)

    monkeypatch.setattr(DocumentTokenizer, "prepare_chat", prepare)
    monkeypatch.setattr(embed, "Progress", progress)
    chats = [{"messages": [{"role": "user", "content": r["name"]}, {"role": "assistant", "content": r["text"]}]}
             for r in demo_records]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    assert curate("--input", tmp_path / "chat.jsonl", "--text-field", "messages", "--output", tmp_path / "c.jsonl",
                  "--model-dir", chat_model_dir, *COMMON) == 0
    assert events[:2] == [("prepare", True), ("progress", None)]  # loaded then, not before: the batches load nothing
    events.clear()
    (tmp_path / "plain.jsonl").write_text("".join(json.dumps(r) + "\n" for r in demo_records))
    assert curate("--input", tmp_path / "plain.jsonl", "--output", tmp_path / "p.jsonl", "--model-dir",
                  chat_model_dir, *COMMON) == 0
    assert events and all(name == "progress" for name, _ in events)


def test_a_field_mixing_conversations_and_plain_text_is_warned_of(tmp_path, demo_records, chat_model_dir, caplog):
    rows = [{"messages": [{"role": "user", "content": r["name"]}, {"role": "assistant", "content": r["text"]}]}
            for r in demo_records[:60]]
    rows[6]["messages"] = "a plain string where a conversation was meant"
    src = tmp_path / "mixed.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    caplog.set_level("INFO")
    assert curate("--input", src, "--text-field", "messages", "--output", tmp_path / "o" / "c.jsonl",
                  "--model-dir", chat_model_dir, "--n-clusters", 4) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "plain text" in r.getMessage()]
    assert len(warnings) == 1
    assert "in 59 of 60 records" in warnings[0] and f"{src}:7" in warnings[0] and f"{src}:1" in warnings[0]
    # every record a conversation: no warning
    caplog.clear()
    rows[6]["messages"] = rows[5]["messages"]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert curate("--input", src, "--text-field", "messages", "--output", tmp_path / "p" / "c.jsonl",
                  "--model-dir", chat_model_dir, "--n-clusters", 4) == 0
    assert not any("plain text" in r.getMessage() for r in caplog.records)
    assert any("rendered with the chat template" in r.getMessage() for r in caplog.records)
    assert not any("has roles other than" in r.getMessage() for r in caplog.records)  # user and assistant only


def test_a_datasets_folder_of_tool_call_chats_is_read_as_its_jsonl(tmp_path, demo_records, chat_model_dir):
    """datasets 5 loads chats whose messages have differing keys (tool calls in some) as List(Json()): each
    message a JSON string in the Arrow file, decoded when datasets reads it. A new user's save_to_disk folder
    of such chats was refused row by row; its messages are now decoded as datasets decodes them."""
    datasets = pytest.importorskip("datasets")
    chats = []
    for i, r in enumerate(demo_records[:40]):
        turn = {"role": "assistant", "content": r["text"]}
        if i % 3 == 0:
            turn["tool_calls"] = [{"type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
        chats.append({"messages": [{"role": "user", "content": r["name"]}, turn]})
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text("".join(json.dumps(c) + "\n" for c in chats))
    loaded = datasets.load_dataset("json", data_files=str(jsonl), split="train")
    loaded.save_to_disk(str(tmp_path / "chatds"))
    args = ["--text-field", "messages", "--model-dir", chat_model_dir, "--n-clusters", 4, "--no-plot"]
    assert curate("--input", jsonl, "--output", tmp_path / "j" / "c.jsonl", *args) == 0
    assert curate("--input", tmp_path / "chatds", "--output", tmp_path / "d" / "c", *args) == 0
    _same_run(tmp_path / "j" / "c", tmp_path / "d" / "c")
    assert np.array_equal(np.load(tmp_path / "chat_token_counts.messages.npy"),
                          np.load(tmp_path / "chatds_token_counts.messages.npy"))


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_conversations_written_as_json_strings_are_warned_of(tmp_path, demo_records, chat_model_dir, caplog, kind):
    """A new user's Parquet held its messages as a JSON string: read as plain text with no word said, its counts
    were the JSON's tokens (14,436) rather than the rendered conversation's (12,803)."""
    rows = [{"messages": json.dumps([{"role": "user", "content": r["name"]}, {"role": "assistant", "content": r["text"]}])}
            for r in demo_records[:30]]
    rows[4]["messages"] = "[{not json, only text that starts like it"
    rows[5]["messages"] = '[{"a": 1}] is JSON but no conversation'
    src = tmp_path / f"encoded.{kind}"
    if kind == "jsonl":
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), src)
    caplog.set_level("INFO")
    assert curate("--input", src, "--text-field", "messages", "--output", tmp_path / "o" / "c.jsonl",
                  "--model-dir", chat_model_dir, "--n-clusters", 4, "--no-plot") == 0
    warnings = [r.getMessage() for r in caplog.records if "written as a JSON string" in r.getMessage()]
    first = f"{src}:1" if kind == "jsonl" else f"{src} row 0"
    assert len(warnings) == 1 and "in 28 of 30 records (the first: " + first + ")" in warnings[0]
    caplog.clear()
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in demo_records[:30]))
    assert curate("--input", plain, "--output", tmp_path / "p" / "c.jsonl", "--model-dir", chat_model_dir,
                  "--n-clusters", 4, "--no-plot") == 0
    assert "written as a JSON string" not in caplog.text


def test_conversations_are_rendered_with_what_trl_passes_the_template(tmp_path, tiny_model_dir, caplog, capsys):
    """TRL's SFT trainer calls the chat template with the record's ``tools`` (a list, or its JSON text) and its
    ``chat_template_kwargs``, renames ShareGPT's from/value to role/content, and renders a conversational
    prompt + completion as one conversation. The counts were of the messages alone (a reviewer's tool-calling set:
    17% short) or the records refused; each is now what transformers renders with those arguments."""
    from transformers import AutoTokenizer

    model = tmp_path / "tools_model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(
        "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if enable_thinking %}<think>{% endif %}{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    tool = {"name": "get_weather", "parameters": {"city": {"type": "string"}}}
    turns = [{"role": "user", "content": "weather in Paris?"}, {"role": "assistant", "content": "sunny"}]
    # Printed through tojson: in the record's key order, its nulls too (as TRL passes what datasets decodes); they
    # were sorted and dropped.
    unsorted = {"name": "convert", "parameters": {"unit": None, "amount": {"type": "number"}}}
    records = [{"messages": turns},
               {"messages": turns, "tools": [tool]},
               {"messages": turns, "tools": json.dumps([tool])},
               {"messages": turns, "tools": None, "chat_template_kwargs": {"enable_thinking": True}},
               {"messages": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
               {"messages": turns, "tools": [unsorted]}]
    hf = AutoTokenizer.from_pretrained(model)

    def tokens(messages, **arguments):
        return len(hf(hf.apply_chat_template(messages, tokenize=False, **arguments), add_special_tokens=False).input_ids)

    expected = [tokens(turns), tokens(turns, tools=[tool]), tokens(turns, tools=[tool]),
                tokens(turns, enable_thinking=True),
                tokens([{"role": "human", "content": "hi"}, {"role": "gpt", "content": "hello"}]),
                tokens(turns, tools=[unsorted])]
    assert tokens(turns, tools=[unsorted]) != tokens(turns, tools=[{"name": "convert", "parameters": {
        "amount": {"type": "number"}}}])
    assert len(set(expected[:2])) == 2 and expected[3] != expected[0]  # the arguments change the tokens
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps(r) + "\n" for r in records * 4))
    with caplog.at_level(logging.WARNING):
        assert curate("--input", chat, "--text-field", "messages", "--output", tmp_path / "c.jsonl", "--model-dir",
                      model, "--n-clusters", 2, "--count-special-tokens", "eos") == 0
    assert np.load(tmp_path / "chat_token_counts.messages.npy").tolist() == expected * 4
    assert "--count-special-tokens eos adds 1 token(s) to each of the 24 conversations too, which TRL's SFT " \
        "trainer does not" in caplog.text
    # Only the template changed: the cache says so in those words (it said "a different tokenizer").
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").write_text(template + "\n")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert curate("--input", chat, "--text-field", "messages", "--output", tmp_path / "c.jsonl", "--model-dir",
                      model, "--n-clusters", 2) == 0
    assert "was computed with a different tokenizer or chat template; its rows are not reused" in caplog.text
    (model / "chat_template.jinja").write_text(template)
    # Parquet: the tools column is read with the messages (null where a record has none).
    table = pa.Table.from_pylist([{"messages": r.get("messages"), "tools": json.dumps(r["tools"]) if isinstance(
        r.get("tools"), list) else r.get("tools")} for r in records[:3]] * 4)
    pq.write_table(table, tmp_path / "chat.parquet")
    assert curate("--input", tmp_path / "chat.parquet", "--text-field", "messages", "--output", tmp_path / "p.parquet",
                  "--model-dir", model, "--n-clusters", 2) == 0
    assert np.load(tmp_path / "chat_token_counts.messages.npy").tolist() == expected[:3] * 4
    # ShareGPT and role/content messages in one Parquet column: each message has all four keys, two of them null.
    mixed = pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"}]},
                                  {"messages": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}])
    pq.write_table(mixed, tmp_path / "mixed.parquet")
    assert curate("--input", tmp_path / "mixed.parquet", "--text-field", "messages", "--output", tmp_path / "m.jsonl",
                  "--model-dir", model, "--n-clusters", 2) == 0
    assert np.load(tmp_path / "mixed_token_counts.messages.npy").tolist() == [tokens([{"role": "user", "content": "hi"}]),
                                                                             expected[4]]
    # A chat_template_kwargs key the trainer's call gives itself, or one that changes only a tokenizing call's ids:
    # the record is named, not the template. Others reach the template as TRL passes them (merged over the tools):
    # add_generation_prompt was refused though TRL passes it for messages.
    for kwargs, refused in (({"tokenize": True}, "which a chat trainer's call sets itself"),
                            ({"truncation": True, "max_length": 3}, "changes the ids of a call that tokenizes")):
        (tmp_path / "own.jsonl").write_text(json.dumps({"messages": turns, "chat_template_kwargs": kwargs}) + "\n")
        capsys.readouterr()
        assert curate("--input", tmp_path / "own.jsonl", "--text-field", "messages", "--output",
                      tmp_path / "own_c.jsonl", "--model-dir", model, "--n-clusters", 1) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / 'own.jsonl'}:1: field 'chat_template_kwargs' sets" in err and refused in err, err
    passed = [{"messages": turns, "chat_template_kwargs": {"add_generation_prompt": True}},
              {"messages": turns, "tools": [unsorted], "chat_template_kwargs": {"tools": [tool]}}]
    (tmp_path / "passed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in passed))
    assert curate("--input", tmp_path / "passed.jsonl", "--text-field", "messages", "--output",
                  tmp_path / "passed_c.jsonl", "--model-dir", model, "--n-clusters", 1) == 0
    assert np.load(tmp_path / "passed_token_counts.messages.npy").tolist() == [
        tokens(turns, add_generation_prompt=True), tokens(turns, tools=[tool])]
    assert tokens(turns, add_generation_prompt=True) != tokens(turns)
    # A conversational prompt + completion is the one conversation prompt + completion.
    pc = tmp_path / "pc.jsonl"
    pc.write_text("".join(json.dumps({"prompt": turns[:1], "completion": turns[1:], "tools": [tool]}) + "\n"
                          for _ in range(8)))
    assert curate("--input", pc, "--text-field", "prompt", "--text-field", "completion", "--output",
                  tmp_path / "pc_c.jsonl", "--model-dir", model, "--n-clusters", 2) == 0
    assert np.load(tmp_path / "pc_token_counts.prompt+completion.npy").tolist() == [expected[1]] * 8
    # TRL renders a prompt alone with add_generation_prompt=True: a prompt and completion record setting it fails there
    # (and continue_final_message cannot go with it: transformers refuses both at once)
    for option in ("add_generation_prompt", "continue_final_message"):
        pc.write_text(json.dumps({"prompt": turns[:1], "completion": turns[1:],
                                  "chat_template_kwargs": {option: False}}) + "\n")
        capsys.readouterr()
        assert curate("--input", pc, "--text-field", "prompt", "--text-field", "completion", "--output",
                      tmp_path / "pc_c.jsonl", "--model-dir", model, "--n-clusters", 1) == 2
        assert f"sets '{option}', which a chat trainer's call sets itself" in (err := capsys.readouterr().err)
        assert "renders the prompt with add_generation_prompt=True" in err


def test_roles_a_chat_template_may_not_know_are_warned_of(tmp_path, demo_records, chat_model_dir, caplog):
    """ShareGPT's human/gpt kept in role/content messages: said once, with how many and where the first is; the
    run goes on (the template renders them, and a trainer with the same template sees the same text)."""
    roles = [("system", "user", "assistant")] * 40 + [("human", "gpt")] * 15 + [("human", "assistant")] * 5
    rows = [{"messages": [{"role": role, "content": r["text"][:200]} for role in kinds]}
            for r, kinds in zip(demo_records, roles)]
    rows.insert(0, {"messages": [{"role": "tool", "content": "x"}, {"role": "developer", "content": "y"}]})
    src = tmp_path / "sharegpt.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    caplog.set_level("INFO")
    assert curate("--input", src, "--text-field", "messages", "--output", tmp_path / "o" / "c.jsonl",
                  "--model-dir", chat_model_dir, "--n-clusters", 4) == 0
    said = [r.getMessage() for r in caplog.records if "has roles other than" in r.getMessage()]
    assert len(said) == 1
    # Loading the tokenizer that renders the template takes seconds (transformers' import): said once, not a pause.
    loading = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("Loading the tokenizer that "
                                                                                     "renders", "Chat template ready"))]
    assert len(loading) == 2 and re.fullmatch(r"Chat template ready in \d+\.\d s", loading[1]), loading
    assert (f"'human' in 20 of the 61 conversations (the first: {src}:42), 'gpt' in 15 of the 61 conversations "
            f"(the first: {src}:42)") in said[0]
    assert "'tool'" not in said[0] and "'developer'" not in said[0]
    # Every conversation is counted as the records are indexed, wherever it lies (tests/test_records.py checks
    # the counts against a plain loop): one late conversation naming its roles otherwise is said too.
    late = rows[:41] + [{"messages": [{"role": "user", "content": "q"}, {"role": "gpt", "content": "a"}]}]
    src = tmp_path / "late.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in late))
    caplog.clear()
    assert curate("--input", src, "--text-field", "messages", "--output", tmp_path / "p" / "c.jsonl",
                  "--model-dir", chat_model_dir, "--n-clusters", 4) == 0
    said = [r.getMessage() for r in caplog.records if "has roles other than" in r.getMessage()]
    assert len(said) == 1 and f"'gpt' in 1 of the 42 conversations (the first: {src}:42)" in said[0]


def test_conversations_trl_cannot_train_are_warned_of(tmp_path, demo_records, chat_model_dir, caplog):
    """A reviewer's curated chats that TRL's SFTTrainer then failed on, though rendered here: chat_template_kwargs
    null (or absent beside records that have it: the datasets library reads it as null there), and ShareGPT
    from/value turns under 'messages' (TRL converts them only in 'conversations'). Each said once, with the first;
    records that all have the field, or ShareGPT under 'conversations', are not."""
    def chat(r, **extra):
        return {"messages": [{"role": "user", "content": r["name"]}, {"role": "assistant", "content": r["text"][:200]}],
                **extra}

    def warned(rows, field="messages"):
        src = tmp_path / f"in{len(list(tmp_path.glob('in*')))}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert curate("--input", src, "--text-field", field, "--output", tmp_path / src.stem / "c.jsonl",
                          "--model-dir", chat_model_dir, "--n-clusters", 3) == 0
        return src, [r.getMessage() for r in caplog.records if "TRL's SFT trainer" in r.getMessage()
                     and ("chat_template_kwargs" in r.getMessage() or "ShareGPT" in r.getMessage())]

    some = [chat(r, chat_template_kwargs={"enable_thinking": False}) if i % 3 else chat(r)
            for i, r in enumerate(demo_records[:30])]
    src, said = warned(some)
    assert said == [f"chat_template_kwargs is absent in 10 (beside 20 that have it) of the 30 conversations (the "
                    f"first: {src}:1): the chat template renders them without it here, but TRL's SFT trainer fails on "
                    "them ('NoneType' object is not a mapping; the datasets library reads a field some records lack "
                    "as null for them); give those records {} or no record the field"]
    nulls = [chat(r, chat_template_kwargs=None if i == 4 else {}) for i, r in enumerate(demo_records[:30])]
    src, said = warned(nulls)
    assert len(said) == 1 and said[0].startswith(f"chat_template_kwargs is null in 1 of the 30 conversations (the "
                                                 f"first: {src}:5)")
    assert warned([chat(r, chat_template_kwargs={}) for r in demo_records[:30]])[1] == []
    assert warned([chat(r) for r in demo_records[:30]])[1] == []
    sharegpt = [{"messages": [{"from": "human", "value": r["name"]}, {"from": "gpt", "value": r["text"][:200]}]}
                if i >= 25 else chat(r) for i, r in enumerate(demo_records[:30])]
    src, said = warned(sharegpt)
    assert said == [f"5 conversation(s) of 'messages' are ShareGPT turns (from/value; the first: {src}:26): read here "
                    "as role/content, but TRL's SFT trainer converts them only in a field named 'conversations' and "
                    "fails on them elsewhere; rename the field, or give the turns role/content keys"]
    renamed = [{"conversations": row["messages"]} for row in sharegpt]
    assert warned(renamed, field="conversations")[1] == []
    # Role/content messages with from/value null beside them (a Parquet column of both kinds gives every row every
    # key; a reviewer's were all said to be ShareGPT turns): none.
    both = [{"messages": [dict(m, **{"from": None, "value": None}) for m in chat(r)["messages"]]}
            for r in demo_records[:30]]
    assert warned(both)[1] == []


def test_dotted_and_joined_fields(tmp_path, demo_records, tiny_model_dir):
    nested = tmp_path / "nested.jsonl"
    nested.write_text("".join(json.dumps({"meta": {"body": r["text"]}, "name": r["name"]}) + "\n"
                              for r in demo_records))
    joined = tmp_path / "joined.jsonl"
    joined.write_text("".join(json.dumps({"text": r["name"] + "\n" + r["text"]}) + "\n" for r in demo_records))
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in demo_records))
    runs = [("n", nested, ["--text-field", "meta.body"]), ("f", flat, []),
            ("jn", nested, ["--text-field", "name", "--text-field", "meta.body"]), ("jf", joined, [])]
    for name, path, flags in runs:
        assert curate("--input", path, *flags, "--output", tmp_path / name / "c.jsonl", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    _same_run(tmp_path / "n" / "c", tmp_path / "f" / "c")
    _same_run(tmp_path / "jn" / "c", tmp_path / "jf" / "c")
    # Each field of one input keeps a token-count cache of its own: a run over one field leaves the other's.
    counts = {name: np.load(tmp_path / name) for name in ("nested_token_counts.meta.body.npy",
                                                          "nested_token_counts.name+meta.body.npy")}
    np.testing.assert_array_equal(counts["nested_token_counts.meta.body.npy"], np.load(tmp_path / "flat_token_counts.npy"))
    assert (counts["nested_token_counts.name+meta.body.npy"] > counts["nested_token_counts.meta.body.npy"]).all()
    assert json.loads((tmp_path / "jn" / "c_meta.json").read_text())["token_counts_file"] == \
        str(tmp_path / "nested_token_counts.name+meta.body.npy")


def test_shards_and_conversion(tmp_path, demo_jsonl, tiny_model_dir):
    out = tmp_path / "s" / "c.jsonl"
    assert curate("--input", demo_jsonl, "--output", tmp_path / "one" / "c.jsonl", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    assert curate("--input", demo_jsonl, "--output", out, "--output-shards", 3, "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    shards = sorted(out.parent.glob("c-*.jsonl"))
    assert [p.name for p in shards] == [f"c-{i:05d}-of-00003.jsonl" for i in range(3)]
    assert b"".join(p.read_bytes() for p in shards) == (tmp_path / "one" / "c.jsonl").read_bytes()
    assert [len(p.read_bytes().splitlines()) for p in shards] == [80, 80, 80]
    meta = json.loads((tmp_path / "s" / "c_meta.json").read_text())
    assert meta["output_files"] == [str(p) for p in shards]
    # JSONL in, Parquet shards out: the same records in the same order.
    assert curate("--input", demo_jsonl, "--output", tmp_path / "q" / "c.parquet", "--output-shards", 2,
                  "--model-dir", tiny_model_dir, *COMMON) == 0
    rows = [row for i in range(2) for row in pq.read_table(tmp_path / "q" / f"c-{i:05d}-of-00002.parquet").to_pylist()]
    assert rows == [json.loads(line) for line in (tmp_path / "one" / "c.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("output", ["c.jsonl", "c.jsonl.zst", "c.parquet"])
def test_a_run_stopped_while_writing_shards_leaves_the_earlier_set_whole(tmp_path, demo_jsonl, tiny_model_dir,
                                                                         monkeypatch, output):
    """A new user's Ctrl-C while 6 shards replaced 4 left 4 new shards beside the earlier set (a glob read
    154,577 records of 92,746) and deleted the metadata describing the set."""
    from diversity_order import writers

    out = tmp_path / output
    base = ["--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, *COMMON]
    assert curate(*base, "--output-shards", 4) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    real, calls = writers.write_shard, []

    def stopped_at_the_third(source, rows, path, kind, schema=None, shown=None):
        calls.append(Path(path).name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(source, rows, path, kind, schema, shown)

    monkeypatch.setattr(writers, "write_shard", stopped_at_the_third)
    assert curate(*base, "--output-shards", 6, "--ordering", "paced") == 130
    assert all(".staged" in name and name.startswith(".c-0000") for name in calls)  # written under staged names
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    # Only the new token-count and embedding caches may differ; the curated set and its metadata are as they were.
    assert {n: b for n, b in after.items() if "-of-" in n or n.endswith("_meta.json")} == \
        {n: b for n, b in before.items() if "-of-" in n or n.endswith("_meta.json")}
    assert not [p for p in tmp_path.iterdir() if "staged" in p.name]  # the staged shards were removed
    monkeypatch.setattr(writers, "write_shard", real)
    # A run killed (no clean-up) while writing 5 shards leaves staged files, which the next completed run sweeps.
    from diversity_order import atomic

    killed = tmp_path / f".c-00002-of-00005{out.name[1:]}.{atomic._HOST}.999999999.staged{out.name[1:]}"
    other = ".jsonl.gz" if output != "c.jsonl.gz" else ".jsonl"  # a killed run that wrote another suffix
    killed_other = tmp_path / f".c-00000-of-00002{other}.{atomic._HOST}.999999999.staged{other}"
    for path in (killed, killed_other):
        path.write_bytes(b"partial")
    assert curate(*base, "--output-shards", 6) == 0
    assert not killed.exists() and not killed_other.exists()
    assert sorted(p.name for p in tmp_path.glob("c-*")) == [f"c-{i:05d}-of-00006{out.name[1:]}" for i in range(6)]


def test_what_a_killed_run_left_is_removed_before_the_next_writes_anything(tmp_path, demo_jsonl, tiny_model_dir,
                                                                          caplog):
    """A reviewer's kill -9 while embedding left a temp file as large as the cache; on a nearly full disk every
    later run then failed for want of room, since only a run that completed removed it. A run removes them when it
    starts (here one that then stops on a bad flag), never a live process's."""
    from diversity_order import atomic

    out = tmp_path / "c.jsonl"
    dead = [tmp_path / f".c_embeddings.npy.{atomic._HOST}.999999999.x1.tmp",
            tmp_path / f".c.jsonl.{atomic._HOST}.999999999.staged.jsonl",
            tmp_path / f".c-00001-of-00002.jsonl.{atomic._HOST}.999999999.staged.jsonl",
            tmp_path / f".c_meta.json.{atomic._HOST}.999999999.x2.tmp",
            tmp_path / f".c_embeddings.fingerprints.npy.{atomic._HOST}.999999999.x4.tmp",
            tmp_path / f".c_embeddings.cache.json.{atomic._HOST}.999999999.x5.tmp",
            tmp_path / f".c_umap2d.fit.npz.{atomic._HOST}.999999999.x6.tmp",
            tmp_path / f".c_strategies.png.{atomic._HOST}.999999999.x7.tmp"]
    live = tmp_path / f".c_embeddings.npy.{atomic._HOST}.{os.getppid()}.x3.tmp"  # a live process's
    for path in [*dead, live]:
        path.write_bytes(b"partial")
    (tmp_path / f".packed.{atomic._HOST}.999999999.y.tmp").mkdir()  # a killed export's staging folder
    with caplog.at_level(logging.INFO):
        assert curate("--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 100000,
                      "--export-packed", tmp_path / "packed") == 2
    assert not any(path.exists() for path in dead) and live.exists()
    assert not (tmp_path / f".packed.{atomic._HOST}.999999999.y.tmp").exists()
    assert "Removed 9 file(s) that killed runs left beside this run's files" in caplog.text


def test_input_files_that_copy_another_are_warned_of(tmp_path, demo_records, tiny_model_dir, caplog):
    """A reviewer's folder held a.jsonl, a copy b.jsonl and a.jsonl.gz: every record read three times, curated into
    the output three times, without a word. Said now, with the copies named; files of other documents are not."""
    import gzip

    folder = tmp_path / "in"
    folder.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in demo_records[:60])
    (folder / "a.jsonl").write_text(text)
    (folder / "b.jsonl").write_text(text)
    (folder / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in demo_records[60:120]))
    (folder / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in demo_records[:60][::-1]))  # reordered
    (folder / "a.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    with caplog.at_level(logging.WARNING):
        assert curate("--input", folder, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir, *COMMON) == 0
    said = [r.getMessage() for r in caplog.records if "hold the same documents" in r.getMessage()]
    # d.jsonl, a's documents in another order, is curated twice as well (a reviewer's was not said)
    assert len(said) == 1 and said[0].startswith(
        f"3 input file(s) hold the same documents as another input file, 1 of them in another order "
        f"({folder / 'a.jsonl.gz'} copies a.jsonl; the last: d.jsonl)")
    caplog.clear()
    pq.write_table(pa.Table.from_pylist(demo_records[:60]), tmp_path / "p1.parquet")
    pq.write_table(pa.Table.from_pylist(demo_records[60:]), tmp_path / "p2.parquet")
    with caplog.at_level(logging.WARNING):
        assert curate("--input", tmp_path / "p*.parquet", "--output", tmp_path / "q.parquet", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    assert "hold the same documents" not in caplog.text
    pq.write_table(pa.Table.from_pylist(demo_records[:60]), tmp_path / "p3.parquet", row_group_size=7)
    with caplog.at_level(logging.WARNING):
        assert curate("--input", tmp_path / "p*.parquet", "--output", tmp_path / "r.parquet", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    assert f"1 input file(s) hold the same documents as another input file ({tmp_path / 'p3.parquet'} " \
        "copies p1.parquet)" in caplog.text


class _Files:
    """A source of several files: their documents' fingerprints one after another."""

    def __init__(self, files):
        self.fingerprints = np.concatenate([np.asarray(f, dtype=np.uint64) for f in files] + [np.zeros(0, np.uint64)])
        ends = np.cumsum([len(f) for f in files]).tolist()
        self.spans = [(Path(f"f{i}"), lo, hi) for i, (lo, hi) in enumerate(zip([0] + ends[:-1], ends)) if hi > lo]

    def file_rows(self):
        return self.spans


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), max_size=14), min_size=2, max_size=5),
       st.sampled_from([1 << 24, 2, 3]), st.integers(1, 4), st.data())
def test_overlapping_files_are_those_a_plain_loop_finds(files, sample, least, data):
    """Each file whose distinct documents are at least half in other files, and at least ``least`` of them (as
    many as the sample stands for), with its counts, as a plain loop over sets finds them (on a sample of the
    fingerprints where there are more than the sample's size); the file named beside it holds some of them."""
    from diversity_order import sources

    source = _Files(files)
    left_out = set(data.draw(st.sets(st.sampled_from([path for path, _, _ in source.spans] or [Path("none")]))))
    total = sum(len(f) for i, f in enumerate(files) if f and Path(f"f{i}") not in left_out)
    modulus = max(1, -(-total // sample))
    kept = {Path(f"f{i}"): {x for x in f if x % modulus == 0} for i, f in enumerate(files)
            if f and Path(f"f{i}") not in left_out}
    expected = []
    for path, own in kept.items():
        elsewhere = set().union(*(other for name, other in kept.items() if name != path))
        if len(kept) > 1 and own and len(own & elsewhere) >= 0.5 * len(own) and len(own & elsewhere) * modulus >= least:
            expected.append((path, len(own & elsewhere), len(own)))
    monkey = pytest.MonkeyPatch()
    monkey.setattr(sources, "OVERLAP_SAMPLE", sample)
    monkey.setattr(sources, "OVERLAP_LEAST", least)
    try:
        found = sources.overlapping_files(source, leave_out=left_out)
    finally:
        monkey.undo()
    assert [(path, shared, distinct) for path, _, shared, distinct in found] == expected
    for path, other, _, _ in found:
        assert other != path and kept[path] & kept[other]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 20), max_size=60), st.sampled_from([1 << 24, 2, 3, 7]))
def test_repeated_documents_are_those_a_plain_loop_finds(prints, sample):
    """The records whose fingerprint an earlier record has (on the modulus sample past the sample's size, scaled
    by it), and the earliest of them with the first record of its document."""
    from diversity_order import sources

    source = _Files([prints])
    modulus = max(1, -(-len(prints) // sample))
    seen, repeats = {}, []
    for row, value in enumerate(prints):
        if value % modulus:
            continue
        if value in seen:
            repeats.append((row, seen[value]))
        else:
            seen[value] = row
    monkey = pytest.MonkeyPatch()
    monkey.setattr(sources, "OVERLAP_SAMPLE", sample)
    try:
        count, example = sources.repeated_documents(source)
    finally:
        monkey.undo()
    assert count == len(repeats) * modulus
    assert example == (repeats[0] if repeats else None)


def test_records_repeating_a_document_are_said(tmp_path, demo_records, tiny_model_dir, caplog):
    """A new user's chat set repeated within one file (cat a a a > b) was curated three times without a word, where
    copies across files were said; one repeated conversation of 389 went unsaid too."""
    lines = [json.dumps(r) + "\n" for r in demo_records[:200]]
    (tmp_path / "one.jsonl").write_text("".join(lines) + lines[7])  # 1 of 201: under a percent, at info level
    (tmp_path / "three.jsonl").write_text("".join(lines[:50]) * 3)
    with caplog.at_level(logging.INFO):
        assert curate("--input", tmp_path / "one.jsonl", "--output", tmp_path / "o.jsonl", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    said = [r for r in caplog.records if "same document as an earlier record" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert said[0].getMessage().startswith(f"Records holding the same document as an earlier record: 1 of 201, e.g. "
                                           f"{tmp_path / 'one.jsonl'}:201 repeats {tmp_path / 'one.jsonl'}:8")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert curate("--input", tmp_path / "three.jsonl", "--output", tmp_path / "t.jsonl", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    said = [r for r in caplog.records if "same document as an earlier record" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and ": 100 of 150, e.g." in said[0].getMessage()


def test_input_files_that_are_mostly_another_files_are_warned_of(tmp_path, demo_records, tiny_model_dir, caplog):
    """A reviewer's c.jsonl held the first 150 lines of a.jsonl: its documents curated twice, without a word (only
    whole copies were said). Said now, naming the file and one that holds its documents; a copy is said once."""
    folder = tmp_path / "in"
    folder.mkdir()
    lines = [json.dumps(r) + "\n" for r in demo_records[:100]]
    (folder / "a.jsonl").write_text("".join(lines))
    (folder / "b.jsonl").write_text("".join(lines))  # a copy: said as one
    (folder / "c.jsonl").write_text("".join(lines[:30]) + "".join(json.dumps(r) + "\n" for r in demo_records[100:110]))
    (folder / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in demo_records[110:160]) + lines[0])
    with caplog.at_level(logging.WARNING):
        assert curate("--input", folder, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir, *COMMON) == 0
    said = [r.getMessage() for r in caplog.records if "other input files hold too" in r.getMessage()]
    assert said == [f"1 input file(s) hold mostly documents other input files hold too ({folder / 'c.jsonl'}: 30 of its "
                    f"40 distinct documents are in other files too, e.g. {folder / 'a.jsonl'}): those documents are "
                    "curated, and trained on, once per file; leave the overlapping files out of --input if that is not "
                    "meant"]
    assert "b.jsonl copies a.jsonl" in caplog.text
    # Shards sharing a few records (a license header, an empty text: a reviewer's 2-record files, each warned): none.
    shards = tmp_path / "shards"
    shards.mkdir()
    header = json.dumps({"text": "Licensed under the Apache License, Version 2.0"}) + "\n"
    for i in range(10):
        (shards / f"s{i}.jsonl").write_text(header + json.dumps(demo_records[200 + i]) + "\n")
    (shards / "t.jsonl").write_text((shards / "s3.jsonl").read_text())  # two records alike by chance: no copy
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert curate("--input", shards, "--output", tmp_path / "s.jsonl", "--model-dir", tiny_model_dir, *COMMON) == 0
    assert "other input files hold too" not in caplog.text and "hold the same documents" not in caplog.text


def test_files_in_several_folders_cache_their_counts_beside_the_output(tmp_path, demo_records, tiny_model_dir, caplog):
    """A reviewer's --input /tmp/rev1/w/a.jsonl --input /tmp/rev1other/b.jsonl wrote /tmp_token_counts.* into /, named
    after their common folder /tmp. Files in one folder keep their cache beside it, as before."""
    for folder, rows in (("x/in", demo_records[:40]), ("y", demo_records[40:80])):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out" / "o.jsonl"
    caplog.set_level(logging.INFO)
    assert curate("--input", tmp_path / "x/in/part.jsonl", "--input", tmp_path / "y/part.jsonl", "--output", out,
                  "--model-dir", tiny_model_dir, *COMMON) == 0
    assert (tmp_path / "out" / "o_token_counts.npy").is_file()
    # not named after their common folder, tmp_path, beside it (the reviewer's /tmp_token_counts.npy)
    assert not (tmp_path.parent / f"{tmp_path.name}_token_counts.npy").exists()
    assert not list(tmp_path.glob("*_token_counts*"))
    assert "The input files are in 2 folders: their token counts are cached beside the output (o_token_counts.npy)" \
        in caplog.text
    meta = json.loads((tmp_path / "out" / "o_meta.json").read_text())
    assert meta["token_counts_file"] == str(tmp_path / "out" / "o_token_counts.npy")
    caplog.clear()
    assert curate("--input", tmp_path / "x/in/part.jsonl", "--input", tmp_path / "y/part.jsonl", "--output", out,
                  "--model-dir", tiny_model_dir, *COMMON) == 0
    assert "Token counts: all 80 rows reused from o_token_counts.npy" in caplog.text
    (tmp_path / "x/in/more.jsonl").write_text("".join(json.dumps(r) + "\n" for r in demo_records[80:90]))
    assert curate("--input", tmp_path / "x/in/*.jsonl", "--output", tmp_path / "out" / "p.jsonl", "--model-dir",
                  tiny_model_dir, *COMMON) == 0
    assert (tmp_path / "x" / "in_token_counts.npy").is_file()  # one folder: beside it, named after it


def test_an_output_named_as_another_runs_metadata_is_refused(tmp_path, demo_jsonl, tiny_model_dir, capsys):
    """A reviewer's --output s_meta.json replaced run s's metadata with curated records: that run lost the record of
    its shards and export, and animate_ordering.py could not read it. A JSON document is not replaced."""
    base = ["--input", demo_jsonl, "--model-dir", tiny_model_dir, *COMMON]
    assert curate(*base, "--output", tmp_path / "s.jsonl") == 0
    meta = (tmp_path / "s_meta.json").read_bytes()
    assert run_error(capsys, *base, "--output", tmp_path / "s_meta.json") == (
        f"error: --output {tmp_path / 's_meta.json'}: is not JSON Lines (its first line is no JSON value: another "
        "run's metadata or report, such as B_meta.json?), and the curated records would replace it; choose another "
        "output path")
    assert (tmp_path / "s_meta.json").read_bytes() == meta
    for name, text in (("blank_first.json", '\n{"version": 2,\n "x": 1}\n'), ("inline.json", '{"version": 2,\n "x": 1}\n')):
        (tmp_path / name).write_text(text)  # a reviewer's: not a lone brace on the first line, still one document
        assert "is not JSON Lines (its first line is no JSON value" in run_error(capsys, *base, "--output",
                                                                                  tmp_path / name)
        assert (tmp_path / name).read_text() == text
    assert curate(*base, "--output", tmp_path / "t.json") == 0  # a curated file named .json, rerun: JSON Lines
    assert curate(*base, "--output", tmp_path / "t.json", "--ordering", "random") == 0


def test_a_full_disk_while_writing_the_outputs_is_one_line(tmp_path, demo_jsonl, tiny_model_dir, monkeypatch, capsys):
    """A reviewer's small tmpfs filled while the curated file, the order, the export or a plot was written: a
    35-line traceback and exit 1 each time. Now one line saying where and what to do, exit 2, files left whole."""
    import errno

    from diversity_order import curate as curate_module
    from diversity_order import writers

    out = tmp_path / "c.jsonl"
    base = ["--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, *COMMON]
    assert curate(*base) == 0
    before = out.read_bytes()

    def full(*args, **kwargs):  # as the file system says it
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".c.jsonl.h.1.staged.jsonl"))

    monkeypatch.setattr(writers, "write_shard", full)
    assert run_error(capsys, *base, "--ordering", "random") == (
        f"error: no room left on the disk writing in {tmp_path} (No space left on device); the earlier files are as "
        "they were: free space or write elsewhere, and run again")
    assert out.read_bytes() == before
    monkeypatch.undo()

    def short(*args, **kwargs):  # as numpy's tofile says it
        raise OSError("100000 requested and 33264 written")

    monkeypatch.setattr(curate_module, "save_npy", short)
    assert run_error(capsys, *base, "--ordering", "random").startswith(
        f"error: no room left on the disk writing in {tmp_path} (100000 requested and 33264 written)")
    monkeypatch.undo()

    def too_large(*args, **kwargs):  # a FAT file system's 4 GiB, or ulimit -f (it was a traceback)
        raise OSError(errno.EFBIG, "File too large", str(tmp_path / ".c.jsonl.h.1.staged.jsonl"))

    before = out.read_bytes()
    monkeypatch.setattr(writers, "write_shard", too_large)
    assert run_error(capsys, *base, "--ordering", "random") == (
        f"error: a file too large for its file system (FAT's 4 GiB) or for ulimit -f, writing in {tmp_path} (File "
        "too large); the earlier files are as they were: write on another file system, and run again")
    assert out.read_bytes() == before


def test_a_first_run_that_fails_before_any_file_is_in_place_leaves_no_metadata(tmp_path, demo_jsonl, tiny_model_dir,
                                                                                monkeypatch, capsys):
    """A reviewer's disk filled on a first sharded run: the metadata left behind named two shards never written
    ("stopped after writing these files"). With no file of the set there, no metadata is left."""
    import errno

    from diversity_order import writers

    def full(index, order, output, kind, shards, schema, before_commit):
        before_commit()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writers, "write_curated", full)
    out = tmp_path / "c.jsonl"
    assert curate("--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--output-shards", 2,
                  *COMMON) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not (tmp_path / "c_meta.json").exists() and not list(tmp_path.glob("c-*"))


def test_a_run_stopped_after_its_shards_leaves_them_known_to_the_next(tmp_path, demo_jsonl, tiny_model_dir,
                                                                      monkeypatch, capsys):
    """A reviewer's Ctrl-C while the clusters were described (after the shards were in place, before the metadata)
    left 3 shards no metadata named; the next run with 2 shards kept them: every record twice in the folder."""
    from diversity_order import curate as curate_module

    out = tmp_path / "c.jsonl"
    base = ["--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, *COMMON]
    assert curate(*base, "--output-shards", 4) == 0

    def stopped(run):
        raise KeyboardInterrupt

    monkeypatch.setattr(curate_module, "describe", stopped)
    assert curate(*base, "--output-shards", 3) == 130
    stub = json.loads((tmp_path / "c_meta.json").read_text())
    assert stub["complete"] is False and stub["output_files"] == [str(tmp_path / f"c-{i:05d}-of-00003.jsonl")
                                                                 for i in range(3)]
    assert sorted(p.name for p in tmp_path.glob("c-*")) == [f"c-{i:05d}-of-00003.jsonl" for i in range(3)]
    from diversity_order.cli import animate_ordering

    code = run_main(animate_ordering.main, ["--meta", str(tmp_path / "c_meta.json"), "--output",
                                            str(tmp_path / "a.mp4")])
    assert code == 2 and ("a curate run stopped while putting these files in place, before its metadata (those not "
                          "there were never written): run it again") in capsys.readouterr().err
    monkeypatch.undo()
    assert curate(*base, "--output-shards", 2) == 0  # the stopped run's set is named, so it goes
    assert sorted(p.name for p in tmp_path.glob("c-*")) == [f"c-{i:05d}-of-00002.jsonl" for i in range(2)]
    lines = b"".join(p.read_bytes() for p in sorted(tmp_path.glob("c-*"))).splitlines()
    assert sorted(lines) == sorted(Path(demo_jsonl).read_bytes().splitlines())


def test_a_killed_runs_staged_files_are_swept_never_a_live_ones(tmp_path):
    from diversity_order import atomic

    target = tmp_path / "c-00001-of-00004.jsonl.zst"
    dead = tmp_path / f".{target.name}.{atomic._HOST}.999999999.staged.jsonl.zst"  # no such process
    live = atomic.staged_path(target, ".jsonl.zst")
    other_host = tmp_path / f".{target.name}.elsewhere.12.staged.jsonl.zst"
    for path in (dead, live, other_host):
        path.write_bytes(b"partial")
    assert live.name == f".{target.name}.{atomic._HOST}.{os.getpid()}.staged.jsonl.zst"
    assert atomic.remove_stale_temps(target) == [dead]
    assert live.exists() and other_host.exists()


def test_another_shard_count_replaces_the_earlier_set(tmp_path, demo_jsonl, tiny_model_dir, caplog):
    """An earlier run's files for the same output with another shard count would hold every record again."""
    out = tmp_path / "c.jsonl"
    (tmp_path / "c-00000-of-00002.json").write_text("not ours: another suffix\n")
    for shards in (4, 2, 1, 3):
        assert curate("--input", demo_jsonl, "--output", out, "--output-shards", shards, "--model-dir",
                      tiny_model_dir, *COMMON) == 0
        written = sorted(tmp_path.glob("c*.jsonl"))
        want = [out] if shards == 1 else [tmp_path / f"c-{i:05d}-of-{shards:05d}.jsonl" for i in range(shards)]
        assert written == sorted(want)
        lines = b"".join(path.read_bytes() for path in written).splitlines()
        assert sorted(lines) == sorted(Path(demo_jsonl).read_bytes().splitlines())  # every record once
    assert "Removed 1 curated file(s) the earlier run for" in caplog.text  # c.jsonl, when 3 shards came
    assert (tmp_path / "c-00000-of-00002.json").is_file()
    # Files named as another shard set of the output are never removed when this run reads them, nor when no
    # earlier run's metadata lists them (a user's own shards, a run interrupted before its metadata).
    shards = sorted(tmp_path.glob("c-*-of-00003.jsonl"))
    before = [path.read_bytes() for path in shards]
    caplog.clear()
    assert curate("--input", tmp_path / "c-*-of-00003.jsonl", "--output", out, "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    assert [path.read_bytes() for path in shards] == before and "were kept: this run read them" in caplog.text
    (tmp_path / "c_meta.json").unlink()
    caplog.clear()
    assert curate("--input", demo_jsonl, "--output", out, "--output-shards", 2, "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    assert [path.read_bytes() for path in shards] == before and out.is_file()
    assert "no earlier run's metadata lists them" in caplog.text and "Removed" not in caplog.text


def test_an_earlier_curated_file_under_another_name_is_replaced(tmp_path, demo_jsonl, tiny_model_dir, caplog):
    """A new user wrote c.jsonl.gz, then c.jsonl.zst (then 2 Parquet shards) for the same output: the earlier file
    stayed beside the new one, whose order and metadata had replaced its own, so a trainer reading the folder read
    every record twice. Files the earlier run's metadata lists and this run does not write are now removed."""
    import logging

    mine = tmp_path / "c.jsonl.bz2"
    mine.write_text("a user's own file named like the output\n")
    for output, extra in ((tmp_path / "c.jsonl.gz", []), (tmp_path / "c.jsonl.zst", []),
                          (tmp_path / "c.parquet", ["--output-shards", 2])):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert curate("--input", demo_jsonl, "--output", output, "--model-dir", tiny_model_dir, *extra,
                          *COMMON) == 0
        written = json.loads((tmp_path / "c_meta.json").read_text())["output_files"]
        assert sorted(str(p) for p in tmp_path.iterdir() if p.name.startswith("c.") or p.name.startswith("c-")) == \
            sorted(written + [str(mine)])
    assert "Removed 1 curated file(s) the earlier run for" in caplog.text and "under another name (c.jsonl.zst)" in \
        caplog.text
    assert mine.read_text() == "a user's own file named like the output\n"


def test_metadata_paths_are_found_from_another_folder(tmp_path, demo_jsonl, tiny_model_dir, monkeypatch, caplog):
    """Paths given relative to one folder are recorded absolute: the next run, started elsewhere, still finds the
    earlier shard set it must replace (and never a same-named file of its own folder)."""
    work, other = tmp_path / "work", tmp_path / "other"
    for folder in (work / "out", other / "out"):
        folder.mkdir(parents=True)
    shutil.copy(demo_jsonl, work / "in.jsonl")
    monkeypatch.chdir(work)
    assert curate("--input", "in.jsonl", "--output", "out/c.jsonl", "--output-shards", 2, "--model-dir",
                  tiny_model_dir, *COMMON) == 0
    meta = json.loads((work / "out" / "c_meta.json").read_text())
    for key in ("input", "output", "token_counts_file", "labels_file", "order_file"):
        assert Path(meta[key]).is_absolute() and Path(meta[key]).exists() or key == "output", key
    assert all(Path(name).is_absolute() for name in meta["input_files"] + meta["output_files"])
    # the digests animate checks the files it reads against are of what the run wrote
    from diversity_order import caches

    assert meta["digests"] == {
        "records": caches.records_digest(np.load(caches.sidecar_paths(Path(meta["token_counts_file"]))[0])),
        "labels": caches.ids_digest(np.load(meta["labels_file"])), "order": caches.ids_digest(np.load(meta["order_file"]))}
    lookalike = other / "out" / "c-00000-of-00002.jsonl"  # the relative name resolves here from `other`
    lookalike.write_text("another dataset\n")
    monkeypatch.chdir(other)
    assert curate("--input", work / "in.jsonl", "--output", work / "out" / "c.jsonl", "--output-shards", 3,
                  "--model-dir", tiny_model_dir, *COMMON) == 0
    assert sorted(p.name for p in (work / "out").glob("c-*.jsonl")) == [f"c-{i:05d}-of-00003.jsonl" for i in range(3)]
    assert lookalike.read_text() == "another dataset\n" and "Removed 2 curated file(s)" in caplog.text


def test_a_run_stopped_while_its_shards_are_renamed_leaves_both_sets_known(tmp_path, demo_jsonl, tiny_model_dir,
                                                                         monkeypatch, capsys):
    """Killed between the renames of a new shard set (one of 3 in place beside the earlier 4): no metadata named
    either set, so the next run with 2 shards kept all 5 files, every record twice. The stub written before the
    renames names both sets, and the next run removes them."""
    from diversity_order import atomic

    out = tmp_path / "c.jsonl"
    base = ["--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, *COMMON]
    assert curate(*base, "--output-shards", 4) == 0
    real, renamed = os.replace, []

    def killed_after_one(source, target):
        if ".staged" in str(source):
            if renamed:
                raise KeyboardInterrupt
            renamed.append(target)
        real(source, target)

    monkeypatch.setattr(atomic.os, "replace", killed_after_one)
    assert curate(*base, "--output-shards", 3) == 130
    monkeypatch.setattr(atomic.os, "replace", real)
    earlier = [str(tmp_path / f"c-{i:05d}-of-00004.jsonl") for i in range(4)]
    stub = json.loads((tmp_path / "c_meta.json").read_text())
    assert stub["complete"] is False and set(stub["output_files"]) == \
        set(earlier) | {str(tmp_path / f"c-{i:05d}-of-00003.jsonl") for i in range(3)}
    assert sorted(p.name for p in tmp_path.glob("c-*")) == \
        ["c-00000-of-00003.jsonl"] + [f"c-{i:05d}-of-00004.jsonl" for i in range(4)]
    # Read as an input now, the mixed set would be records twice and records missing (a reviewer's kill -9 mid-rename
    # gave 14 of each, curated without a word): refused until the run is completed.
    capsys.readouterr()
    assert curate("--input", tmp_path / "c-*-of-00004.jsonl", "--output", tmp_path / "next" / "x.jsonl",
                  "--model-dir", tiny_model_dir, *COMMON) == 2
    assert capsys.readouterr().err == (
        f"error: --input: {tmp_path / 'c-00000-of-00004.jsonl'} is among the files of a curate run that stopped before "
        "it finished (c_meta.json says so): they may be some of its shards and some of an earlier run's; run that "
        "curate command again to complete them, then read them\n")
    moved = tmp_path / "moved"  # the folder copied whole: its stub's paths are the old ones, its names the same
    moved.mkdir()
    for path in [*tmp_path.glob("c-*-of-00004.jsonl"), tmp_path / "c_meta.json"]:
        shutil.copy(path, moved / path.name)
    assert curate("--input", moved, "--output", tmp_path / "next" / "x.jsonl", "--model-dir", tiny_model_dir,
                  *COMMON) == 2
    assert "is among the files of a curate run that stopped before it finished" in capsys.readouterr().err
    shutil.rmtree(moved)
    assert curate(*base, "--output-shards", 2) == 0
    assert sorted(p.name for p in tmp_path.glob("c-*")) == [f"c-{i:05d}-of-00002.jsonl" for i in range(2)]
    lines = [line for path in sorted(tmp_path.glob("c-*")) for line in path.read_bytes().splitlines()]
    assert sorted(lines) == sorted(Path(demo_jsonl).read_bytes().splitlines())


def test_an_interrupted_run_leaves_no_earlier_metadata_beside_its_files(tmp_path, demo_jsonl, tiny_model_dir,
                                                                        monkeypatch):
    out = tmp_path / "c.jsonl"
    assert curate("--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, *COMMON) == 0
    assert (tmp_path / "c_meta.json").is_file()
    from diversity_order import curate as curate_module

    def interrupted(run):
        raise KeyboardInterrupt

    monkeypatch.setattr(curate_module, "describe", interrupted)  # after the curated file, before the metadata
    assert curate("--input", demo_jsonl, "--output", out, "--model-dir", tiny_model_dir, *COMMON,
                  "--ordering", "random") == 130
    # Not the earlier run's metadata: a stub that names the files now there and says the run did not finish.
    stub = json.loads((tmp_path / "c_meta.json").read_text())
    assert stub["complete"] is False and stub["output_files"] == [str(out)] and "ordering" not in stub
    assert sorted(out.read_bytes().splitlines()) == sorted(Path(demo_jsonl).read_bytes().splitlines())


def test_more_shards_than_records_are_written_empty_with_a_warning(tmp_path, demo_jsonl, tiny_model_dir, caplog):
    n = len(Path(demo_jsonl).read_bytes().splitlines())
    out = tmp_path / "c.jsonl"
    assert curate("--input", demo_jsonl, "--output", out, "--output-shards", n + 2, "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    shards = sorted(tmp_path.glob("c-*.jsonl"))
    assert len(shards) == n + 2 and sum(p.stat().st_size == 0 for p in shards) == 2
    assert any(f"--output-shards {n + 2} for {n} records: 2 of the shards will be empty" in r.getMessage()
               for r in caplog.records if r.levelname == "WARNING")
    # The set reads back as one input, its empty shards included (in Parquet too).
    again = tmp_path / "again" / "c.parquet"
    assert curate("--input", tmp_path / "c-*.jsonl", "--output", again, "--output-shards", n + 1,
                  "--model-dir", tiny_model_dir, *COMMON) == 0
    assert sorted(again.parent.glob("c-*.parquet")) and curate(
        "--input", again.parent / "c-*.parquet", "--output", tmp_path / "back.jsonl", "--model-dir",
        tiny_model_dir, *COMMON) == 0
    assert sorted((tmp_path / "back.jsonl").read_bytes().splitlines()) == sorted(Path(demo_jsonl).read_bytes().splitlines())


def test_folder_and_glob_inputs_take_data_files_named_in_any_case_and_say_what_they_leave_out(
        tmp_path, demo_jsonl, tiny_model_dir, caplog):
    """A folder's UP.JSONL and z.jsonl.GZ are data (given alone they were read; in a folder they were dropped
    without a word, and their records were missing from the output); its hidden files and other files are left
    out and said. A cache manifest an earlier run left beside one input file is never read as records: a glob
    over the folder took it and blamed the user's data ("not valid JSON")."""
    import gzip

    lines = Path(demo_jsonl).read_bytes().splitlines(keepends=True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(b"".join(lines[:40]))
    (data / "UP.JSONL").write_bytes(b"".join(lines[40:45]))
    (data / "z.jsonl.GZ").write_bytes(gzip.compress(b"".join(lines[45:50])))
    (data / ".hidden.jsonl").write_bytes(lines[50])
    (data / "README.md").write_text("about these files\n")
    (data / "part-00009").write_bytes(b"".join(lines[51:53]))  # JSON Lines not named so: left out, but warned of
    want = sorted(lines[:50])
    few = ("--n-clusters", 3, "--seq-len", 4096)
    # a run on one file first: its token counts are cached beside it (UP_token_counts.cache.json, ...)
    assert curate("--input", data / "UP.JSONL", "--output", tmp_path / "one.jsonl", "--model-dir", tiny_model_dir,
                  *few) == 0
    assert (data / "UP_token_counts.cache.json").is_file()
    for value, name in ((data, "folder"), (str(data / "*"), "all"), (str(data / "*.json*"), "json"),
                        (str(data / "*.JSONL"), "upper")):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert curate("--input", value, "--output", tmp_path / f"{name}.jsonl", "--model-dir", tiny_model_dir,
                          *few) == 0
        got = sorted((tmp_path / f"{name}.jsonl").read_bytes().splitlines(keepends=True))
        expected = {"upper": lines[40:45], "json": lines[:40] + lines[45:50]}.get(name, want)  # (globs match case)
        assert got == sorted(expected), name
        if name != "upper":
            assert "cache manifest(s) left out (UP_token_counts.cache.json)" in caplog.text
        if name == "folder":
            warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "left out" in r.getMessage()]
            assert warned == [f"--input {data}: 4 file(s) not named as data left out (README.md ...); not read, though "
                              "their first bytes say they hold records: part-00009 (JSON Lines); name them as data "
                              "(.parquet, .jsonl) or give them as --input"]
        assert ("1 hidden file(s) left out (.hidden.jsonl)" in caplog.text) == (name == "folder")


def test_a_folder_of_only_unnamed_data_files_is_refused_naming_them(tmp_path, demo_records, tiny_model_dir, capsys):
    """A folder holding only a Parquet file named without a suffix (as `--output x --output-format parquet` writes
    it) was refused as holding no data, without naming what it held; the line names the file and the glob that
    reads it, and that glob does."""
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([{"text": r["text"]} for r in demo_records[:30]]), folder / "part")
    base = ["--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 2]
    assert run_error(capsys, "--input", folder, *base) == (
        f"error: --input {folder}: a folder with no .parquet or .jsonl/.json/.ndjson[.gz|.zst] files (nor a datasets "
        f"folder written by save_to_disk); it holds 1 file(s) named otherwise (part): a folder's files are taken by "
        f"their names, a file given alone or by a glob (such as {folder}/*) by what it holds")
    assert curate("--input", str(folder / "*"), *base) == 0
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 30


def test_a_sharded_runs_output_folder_is_an_input_again(tmp_path, demo_jsonl, tiny_model_dir, caplog):
    """The folder of a run's shards also holds its metadata and cache manifests (.json): not records; and, where
    the run exported its packed sequences into it, their folder (Parquet of token ids): not records either (a
    new user's read-back was refused as a folder of two formats, with a glob hint that matched nothing)."""
    import logging

    want = sorted(Path(demo_jsonl).read_bytes().splitlines())
    # (shards named .json too: the metadata and reports beside them are .json as well, JSON documents, where the
    # folder was refused: "c_clusters.json:1: not valid JSON")
    for name in ("c.jsonl", "c.parquet", "c.json"):
        folder = tmp_path / name.split(".")[1]
        export = ("--export-packed", folder / "packed") if name == "c.jsonl" else ()
        assert curate("--input", demo_jsonl, "--output", folder / name, "--output-shards", 2, "--model-dir",
                      tiny_model_dir, *COMMON, *export) == 0
        assert (folder / "c_meta.json").is_file() and list(folder.glob("*.cache.json"))
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert curate("--input", folder, "--output", tmp_path / f"again_{name}.jsonl", "--model-dir",
                          tiny_model_dir, *COMMON) == 0
        assert ".json file(s) left out" in caplog.text
        assert (f"{folder / 'packed'} left out (packed sequences" in caplog.text) == bool(export)
        back = (tmp_path / f"again_{name}.jsonl").read_bytes().splitlines()
        assert sorted(json.dumps(json.loads(line), sort_keys=True) for line in back) == \
            sorted(json.dumps(json.loads(line), sort_keys=True) for line in want)


def test_special_tokens_are_counted_in_every_window(tmp_path, demo_jsonl, tiny_model_dir):
    from diversity_order.diversity import window_counts

    metas = {}
    for mode in ("none", "eos"):
        assert curate("--input", demo_jsonl, "--output", tmp_path / mode / "c.jsonl", "--model-dir", tiny_model_dir,
                      "--count-special-tokens", mode, *COMMON) == 0
        metas[mode] = json.loads((tmp_path / mode / "c_meta.json").read_text())
    assert metas["eos"]["total_tokens"] == metas["none"]["total_tokens"] + N_DEMO
    raw = np.load(tmp_path / "demo_token_counts.npy")  # the cache keeps the documents' own counts
    assert int(raw.sum()) == metas["none"]["total_tokens"]
    labels, order = np.load(tmp_path / "eos" / "c_labels.npy"), np.load(tmp_path / "eos" / "c_order.npy")
    unique, _ = window_counts(labels, raw + 1, 4096, order)
    assert metas["eos"]["token_window_diversity"]["curated"]["n_sequences"] == unique.size
    assert metas["eos"]["token_window_diversity"]["curated"]["mean"] == pytest.approx(unique.mean(), abs=0.005)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_files_whose_schemas_join_are_read_as_one(tmp_path, demo_records, chat_model_dir, suffix):
    """Shards of one chat corpus where only some hold tool calls (their message structs have more keys), or a
    column some lack, were refused as 'of another schema'. Rows are now written with the joined schema: every
    row once, its values as its file had them, null where its file had no such column or key."""
    def chat(i, r):
        turn = {"role": "assistant", "content": r["text"]}
        if i % 2:
            turn["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
        return {"messages": [{"role": "user", "content": r["name"]}, turn], "id": i}

    rows = [chat(i, r) for i, r in enumerate(demo_records[:40])]
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.Table.from_pylist([r for r in rows[:20] if not r["id"] % 2]), tmp_path / "shards" / "a.parquet")
    pq.write_table(pa.Table.from_pylist([dict(r, lang="en") for r in rows[:20] if r["id"] % 2]),
                   tmp_path / "shards" / "b.parquet")
    pq.write_table(pa.Table.from_pylist(rows[20:]), tmp_path / "shards" / "c.parquet")
    out = tmp_path / "o" / f"c.{suffix}"
    assert curate("--input", tmp_path / "shards", "--text-field", "messages", "--output", out, "--model-dir",
                  chat_model_dir, "--n-clusters", 3, "--no-plot") == 0
    if suffix == "parquet":
        written = pq.read_table(out).to_pylist()
    else:
        written = [json.loads(line) for line in out.read_text().splitlines()]
    inputs = [row for name in "abc" for row in pq.read_table(tmp_path / "shards" / f"{name}.parquet").to_pylist()]
    order = np.load(tmp_path / "o" / "c_order.npy")
    assert len(written) == len(inputs) == 40
    def pruned(value):  # what a row says, nulls (what its file lacked, or filled in) left out
        if isinstance(value, dict):
            return {k: pruned(v) for k, v in value.items() if v is not None}
        return [pruned(v) for v in value] if isinstance(value, list) else value

    for got, row in zip(written, (inputs[i] for i in order), strict=True):
        assert pruned(got) == pruned(row)
    if suffix == "parquet":  # one schema, the joined one: 'lang' and the tool calls' keys for every row
        assert pq.read_schema(out).names == ["messages", "id", "lang"]


def test_bad_input_in_each_format_is_one_line(tmp_path, demo_records, tiny_model_dir, capsys):
    base = ("--model-dir", tiny_model_dir, "--output", tmp_path / "o" / "c.jsonl", "--n-clusters", 1)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"body": r["text"]} for r in demo_records[:20]]), parquet)
    assert "no column 'text' (columns: body)" in run_error(capsys, "--input", parquet, *base)
    chats = tmp_path / "chats.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": 1, "messages": [{"role": "user", "content": "hi"}]}]), chats)
    assert "no field 'messages.content' (this record has keys: id, messages)" in run_error(
        capsys, "--input", chats, "--text-field", "messages.content", *base)  # every column, not the one read
    assert run_error(capsys, "--input", chats, *base).endswith(
        "no column 'text' (columns: id, messages); choose the text field with --text-field (its 'messages' holds "
        "conversations, which --text-field messages reads)")
    # Files of two schemas: the error says how the second differs (a new user's score column was a string in one).
    scored = [pa.table({"text": ["a", "b"], "quality": [0.5, 0.7]}), pa.table({"text": ["c"], "quality": ["high"]}),
              pa.table({"text": ["d"]}), pa.table({"text": ["e"], "quality": [0.1], "lang": ["en"]})]
    for i, table in enumerate(scored):
        (tmp_path / "mixed").mkdir(exist_ok=True)
        pq.write_table(table, tmp_path / "mixed" / f"part-{i}.parquet")
    scored.append(pa.table({"text": ["f"], "quality": pa.array([2**60 + 1], pa.int64())}))
    pq.write_table(scored[-1], tmp_path / "mixed" / f"part-{len(scored) - 1}.parquet")
    for i, difference in ((1, "'quality' is string, not double"),  # (columns that join: see the test below)
                          (4, "'quality' holds integers in one file and floating point numbers in another")):
        assert run_error(capsys, "--input", tmp_path / "mixed" / "part-0.parquet", "--input",
                         tmp_path / "mixed" / f"part-{i}.parquet", *base) == (
            f"error: --input {tmp_path / 'mixed' / f'part-{i}.parquet'}: its columns differ from "
            f"{tmp_path / 'mixed' / 'part-0.parquet'}'s ({difference}); give files of one schema")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(parquet.read_bytes()[:200])
    assert f"{corrupt}: not a Parquet file that can be read" in run_error(capsys, "--input", corrupt, *base)
    # A chat source beside plain ones (a new user's fine-tuning mix): the error says how the chat one is read.
    plain, chat = tmp_path / "plain.jsonl", tmp_path / "chat.jsonl"
    plain.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in demo_records[:20]))
    chat.write_text(json.dumps({"id": 1, "messages": [{"role": "user", "content": "q"},
                                                      {"role": "assistant", "content": "a"}]}) + "\n")
    err = run_error(capsys, "--input", plain, "--input", chat, *base)
    assert err.startswith(f"error: {chat}:1: no field 'text' (this record has keys: id, messages)")
    assert err.endswith("its 'messages' holds a conversation, which --text-field messages reads (a run reads one "
                        "field: give chat and plain records one field name, or curate them apart)")
    assert "no file matches this pattern" in run_error(capsys, "--input", tmp_path / "none" / "*.parquet", *base)
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n" +
                    json.dumps({"messages": [{"role": "user", "content": ["a", "b"]}]}) + "\n")
    assert run_error(capsys, "--input", chat, "--text-field", "messages", *base) == (
        f"error: {chat}:2: field 'messages[0]' has a content that is a JSON array, expected a string (content "
        "parts: join their texts into one string; images and audio have no tokens here)")
    for message, said in (({"role": "user", "text": "hi"}, "(its keys: role, text)"), ("hi", "(a JSON string)"),
                          ({"\n": None}, '(its keys: "\\n")')):  # a fuzzed key: still one line
        chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n" +
                        json.dumps({"messages": [{"role": "user", "content": "hi"}, message]}) + "\n")
        assert run_error(capsys, "--input", chat, "--text-field", "messages", *base) == (
            f"error: {chat}:2: field 'messages[1]' is not a {{\"role\": ..., \"content\": ...}} object {said}")
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n" +
                    json.dumps({"messages": [{"role": "assistant", "tool_calls": [{"name": "f"}]}]}) + "\n")
    assert run_error(capsys, "--input", chat, "--text-field", "messages", *base).endswith(
        "(its keys: role, tool_calls) (a turn that only calls tools, as OpenAI's API writes it: give it the content "
        "\"\"; its tool_calls stay)")
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": "[{"}) + "\n")
    assert run_error(capsys, "--input", chat, "--text-field", "messages", *base) == (
        f"error: {chat}:1: field 'tools' is a string that is not JSON (a chat trainer decodes it to pass the tools to "
        "the chat template)")
    chat.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "completion": "yes"}) + "\n")
    assert run_error(capsys, "--input", chat, "--text-field", "prompt", "--text-field", "completion", *base) == (
        f"error: {chat}:1: field 'prompt' is a conversation and 'completion' a text; fields read together must be "
        "all texts (joined) or all conversations (prompt + completion messages)")
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert "has no chat template" in run_error(capsys, "--input", chat, "--text-field", "messages", *base)
    # A template that refuses a conversation (as many raise on a role they do not know): the record is named.
    strict = tmp_path / "strict_model"
    shutil.copytree(tiny_model_dir, strict)
    (strict / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}{{ m['content'] }}\n{% endfor %}")
    chat.write_text("".join(json.dumps({"messages": [{"role": role, "content": "hi"}]}) + "\n"
                            for role in ("user", "assistant", "robot", "user")))
    assert run_error(capsys, "--input", chat, "--text-field", "messages", "--model-dir", strict,
                     *base[2:]) == (f"error: {chat}:3: the chat template of --model-dir {strict} cannot render this "
                                    "conversation (Unknown role: robot)")
    # Several it refuses: all counted at once (a reviewer's template without a system role stopped at the first).
    chat.write_text("".join(json.dumps({"messages": [{"role": role, "content": "hi"}]}) + "\n"
                            for role in ("user", "robot", "user", "system", "user", "robot")))
    assert run_error(capsys, "--input", chat, "--text-field", "messages", "--model-dir", strict,
                     *base[2:]) == (f"error: {chat}:2: the chat template of --model-dir {strict} cannot render this "
                                    f"conversation (Unknown role: robot); it refuses 3 conversations in all, of the 6 left "
                                    f"to render when it first did (the last: {chat}:6)")
    # A record's own template (chat_template_kwargs' chat_template) that refuses it: that template is blamed, not
    # the model folder's.
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                "chat_template_kwargs": {"chat_template": "{{ raise_exception('mine') }}"}}) + "\n")
    assert run_error(capsys, "--input", chat, "--text-field", "messages", "--model-dir", strict,
                     *base[2:]) == (f"error: {chat}:1: the record's own chat template (its chat_template_kwargs' "
                                    "chat_template) cannot render this conversation (mine)")
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": None}]}]), parquet)
    assert run_error(capsys, "--input", parquet, "--text-field", "messages", *base).endswith(
        "row 0: field 'messages[0]' has a content that is null, expected a string (a turn that only calls "
        "tools: give it the content \"\"; its tool_calls stay as they are)")
    # Every unreadable row of the file is counted in the one pass, over its row groups, with the last.
    texts = [None if i in (3, 40, 41) else f"text {i}" for i in range(50)]
    pq.write_table(pa.table({"text": texts}), parquet, row_group_size=16)
    err = run_error(capsys, "--input", parquet, *base)
    assert err.startswith(f"error: {parquet} row 3: field 'text' is null")
    assert err.endswith(f"(3 records of this file cannot be read; the last: {parquet} row 41)")
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "x"}\n')
    assert "the inputs mix formats" in run_error(capsys, "--input", jsonl, "--input", parquet, *base)
    assert "is given twice" in run_error(capsys, "--input", jsonl, "--input", jsonl, *base)
    for name in ("x.csv", "x.TSV.gz"):  # JSONL under a name that says another format
        assert run_error(capsys, "--input", jsonl, "--model-dir", tiny_model_dir, "--output", tmp_path / name) == (
            f"error: --output {tmp_path / name}: {'.csv' if name == 'x.csv' else '.tsv'} is not a format this "
            "writes; name it .jsonl (or .json, .ndjson, each optionally .gz or .zst) or .parquet")
    assert not (tmp_path / "x.csv").exists()
    # Whatever else a suffix names (a chat template, weights, a cache) is not replaced by JSONL either.
    for name in ("chat_template.jinja", "model.safetensors", "d_token_counts.messages.npy", "notes.md"):
        assert run_error(capsys, "--input", jsonl, "--model-dir", tiny_model_dir, "--output", tmp_path / name
                         ).startswith(f"error: --output {tmp_path / name}: .")
        assert not (tmp_path / name).exists()
    # Suffixes in capitals (the shards and the files beside it are named from it) and nameless outputs: one line.
    for name, said in (("x.JSONL", "write its suffix in lower case (x.jsonl)"),
                       ("Curated.V2.JSONL.Zst", "write its suffix in lower case (Curated.V2.jsonl.zst)"),
                       ("x.Parquet", "write its suffix in lower case (x.parquet)"),
                       ("x.jsonl.GZ", "write its suffix in lower case (x.jsonl.gz)"),
                       ("x.parquet.gz", "Parquet compresses inside the file; name it .parquet"),
                       (".jsonl", f"give the file a name before its suffix (e.g. {tmp_path / 'curated.jsonl'})")):
        assert run_error(capsys, "--input", jsonl, "--model-dir", tiny_model_dir, "--output", tmp_path / name
                         ).startswith(f"error: --output {tmp_path / name}: {said}")
    # A dotted part that is no file suffix is a name: the input's format.
    for name in ("curated.v2", "data-2024.11.27"):
        assert curate("--input", jsonl, "--model-dir", tiny_model_dir, "--output", tmp_path / "dots" / name,
                      "--n-clusters", 1, "--no-plot") == 0
        assert (tmp_path / "dots" / name).read_bytes() == jsonl.read_bytes()
    # Nor a file inside a folder given as --input: the next run over that folder would read it as input too.
    (tmp_path / "fin").mkdir()
    shutil.copy(jsonl, tmp_path / "fin" / "part.jsonl")
    for name in ("cur.jsonl", "sub/cur.jsonl"):
        assert run_error(capsys, "--input", tmp_path / "fin", "--model-dir", tiny_model_dir, "--output",
                         tmp_path / "fin" / name) == (
            f"error: --output {tmp_path / 'fin' / name}: inside the --input folder {tmp_path / 'fin'}, which is read "
            "whole: a later run would read the curated records as input too; write outside it")
    assert sorted(p.name for p in (tmp_path / "fin").iterdir()) == ["part.jsonl"]
    # Nor any file of the model folder, whatever its name.
    for name in ("config.json", "sub/curated.jsonl"):
        assert run_error(capsys, "--input", jsonl, "--model-dir", tiny_model_dir, "--output", tiny_model_dir / name
                         ) == (f"error: --output {tiny_model_dir / name}: inside --model-dir {tiny_model_dir}, which "
                               "this run reads and never writes; choose another folder")
    assert ".csv is not a format this writes" in run_error(
        capsys, "--input", jsonl, "--model-dir", tiny_model_dir, "--output", tmp_path / "x.csv", "--output-format",
        "parquet")
    datasets = pytest.importorskip("datasets")  # a dev extra (save_to_disk folders)

    datasets.Dataset.from_list([{"text": "a b"}]).save_to_disk(str(tmp_path / "ds"))
    capsys.readouterr()  # its progress bar
    assert "holds the input" in run_error(capsys, "--input", tmp_path / "ds", "--model-dir", tiny_model_dir,
                                          "--output", tmp_path / "ds")
    assert "its name says jsonl, but --output-format is parquet" in run_error(
        capsys, "--input", jsonl, "--model-dir", tiny_model_dir, "--output", tmp_path / "x.jsonl", "--output-format",
        "parquet")


def test_incremental_run_on_parquet_embeds_only_new_rows(tmp_path, demo_records, tiny_model_dir, caplog):
    import logging

    caplog.set_level(logging.INFO)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(demo_records[:200]), parquet, row_group_size=64)
    assert curate("--input", parquet, "--output", tmp_path / "o" / "c.parquet", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    # Indexing counts records, not the files' encoded bytes (a new user read "0.44 MB" beside "6.4 MB of records")
    assert re.search(r"Indexing \S*d\.parquet: 64 of 200 records \(32%\)", caplog.text)  # its first row group
    edited = [dict(r) for r in demo_records]
    edited[5]["text"] += " edited"
    del edited[10]
    pq.write_table(pa.Table.from_pylist(edited), parquet, row_group_size=64)
    os.utime(parquet)
    caplog.clear()
    assert curate("--input", parquet, "--output", tmp_path / "o" / "c.parquet", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    assert f"Embedding {1 + N_DEMO - 200} record(s) of {N_DEMO - 1}" in caplog.text


def test_deep_extraction_reads_every_format(tmp_path, demo_records, tiny_model_dir):
    datasets = pytest.importorskip("datasets")  # a dev extra (save_to_disk folders)

    from diversity_order import deep

    records = demo_records[:40]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet, row_group_size=16)
    folder = tmp_path / "d_ds"
    datasets.Dataset.from_list(records).save_to_disk(str(folder), num_shards=2)
    vectors = {}
    for name, path in (("jsonl", jsonl), ("parquet", parquet), ("datasets", folder)):
        out = tmp_path / f"{name}.npy"
        deep.extract(deep.DeepConfig(input=path, output=out, model_dir=tiny_model_dir, progress=False,
                                     dtype="float32", device="cpu", token_budget=4096, batch_size=8))
        vectors[name] = np.load(out)
    np.testing.assert_array_equal(vectors["jsonl"], vectors["parquet"])
    np.testing.assert_array_equal(vectors["jsonl"], vectors["datasets"])


def test_torchrun_on_parquet_equals_single_process(tmp_path, demo_records, tiny_model_dir):
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        (folder / "in").mkdir(parents=True)
        for i in range(2):
            pq.write_table(pa.Table.from_pylist(demo_records[i * 60:(i + 1) * 60]), folder / "in" / f"p{i}.parquet",
                           row_group_size=25)
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", *COMMON]  # the ranks run on CPU: so does this
    assert curate("--input", single / "in", "--output", single / "c.parquet", *common) == 0
    # Its own cache registry: else it would reuse the single run's embeddings and share no work.
    env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               DIVERSITY_ORDER_CACHE_DIR=str(tmp_path / "multi_registry"))  # 2 CPU ranks, also on a GPU machine
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "curate_dataset.py",
           *map(str, ["--input", multi / "in", "--output", multi / "c.parquet", *common]), "--no-progress", "--no-plot"]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Rank 0 of 2" in done.stderr and "taken from" not in done.stderr  # the ranks shared the embedding
    for name in ["c_labels.npy", "c_order.npy", "c_embeddings.npy"]:
        assert (multi / name).read_bytes() == (single / name).read_bytes(), name
    assert pq.read_table(multi / "c.parquet").equals(pq.read_table(single / "c.parquet"))


def _bos_model(tiny_model_dir, folder):
    """A copy of the tiny model whose tokenizer puts <s> before every text (as Llama's does); its special ids."""
    shutil.copytree(tiny_model_dir, folder)
    pipeline = json.loads((folder / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in pipeline["added_tokens"]}
    pipeline["post_processor"] = {
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [ids["<s>"]], "tokens": ["<s>"]}}}
    (folder / "tokenizer.json").write_text(json.dumps(pipeline))
    return folder, ids


def test_eos_alone_with_a_tokenizer_that_adds_a_bos_is_warned_of(tiny_model_dir, demo_jsonl, tmp_path, caplog):
    """A reviewer's Llama-like tokenizer: TRL's SFT trainer tokenizes plain texts with its special tokens (a BOS
    each) before appending EOS, and --count-special-tokens eos, as the README advised, counted every document a
    token short. Said, with the flag that counts it; not for a tokenizer that adds none, nor for bos-eos."""
    folder, _ = _bos_model(tiny_model_dir, tmp_path / "bos_model")
    said = "--count-special-tokens eos: the tokenizer of --model-dir puts <s> before every text itself"
    for model, mode, warned in ((folder, "eos", True), (folder, "bos-eos", False), (tiny_model_dir, "eos", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert curate("--input", demo_jsonl, "--output", tmp_path / f"o_{mode}_{warned}.jsonl", "--model-dir",
                          model, "--count-special-tokens", mode, *COMMON) == 0
        assert (said in caplog.text) == warned, (model, mode)
        assert ("give --count-special-tokens bos-eos for such a trainer" in caplog.text) == warned


def test_special_tokens_are_the_ones_the_tokenizer_adds(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from diversity_order.tokenizer import DocumentTokenizer

    folder, ids = _bos_model(tiny_model_dir, tmp_path / "bos_model")
    ours = DocumentTokenizer(folder)
    hf = AutoTokenizer.from_pretrained(str(folder))
    text = "the galaxy and the oven"
    with_special, without = hf(text)["input_ids"], hf(text, add_special_tokens=False)["input_ids"]
    before, after = ours.special_tokens_per_document("tokenizer")
    assert before + without + after == with_special and before == [ids["<s>"]] and after == []
    assert ours.special_tokens_per_document("eos") == ([], [ids["</s>"]])
    assert ours.special_tokens_per_document("bos-eos") == ([ids["<s>"]], [ids["</s>"]])
    assert ours.special_tokens_per_document("none") == ([], [])


def _without_nulls(value):
    """A record as JSON has it: Parquet gives every row every column, null where the record had none."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


@settings(max_examples=40, deadline=None)
@given(st.lists(st.fixed_dictionaries(
    {"text": st.text(min_size=1, max_size=8)},
    optional={"a": st.none() | st.integers(-5, 5), "b": st.text(max_size=4),
              "c": st.fixed_dictionaries({"x": st.integers(0, 3)}, optional={"y": st.none() | st.text(max_size=3)}),
              "d": st.lists(st.integers(0, 9), max_size=3)}), min_size=1, max_size=30),
       st.integers(1, 6), st.integers(0, 2**31))
def test_jsonl_converted_to_parquet_keeps_every_field_of_every_record_in_one_schema(tmp_path_factory, records,
                                                                                     shards, seed):
    """Each Parquet row holds its record's fields, whichever record first has a field (a plain loop over the
    records says what each row must hold), and every shard has the one schema."""
    from diversity_order import arrow_json, writers
    from diversity_order.records import scan_jsonl

    folder = tmp_path_factory.mktemp("convert")
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    order = np.random.default_rng(seed).permutation(len(records))
    written = writers.write_curated(scan_jsonl(folder / "in.jsonl", progress=False), order, folder / "out.parquet",
                                    "parquet", shards)
    tables = [pq.read_table(path) for path, _ in written]
    assert all(table.schema == tables[0].schema for table in tables)
    fields = {name for record in records for name in record}
    assert set(tables[0].column_names) == fields
    rows = [row for table in tables for row in arrow_json.rows(table)]
    assert [_without_nulls(row) for row in rows] == [_without_nulls(records[i]) for i in order]


_JSON_LEAVES = (st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-1, 1) | st.text(max_size=3)
                # unsigned 64-bit integers only, or past 64 bits: no Parquet integer holds those
                | st.sampled_from([1 << 63, (1 << 64) - 1, -(1 << 63), 1 << 64, -(1 << 70)]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({"text": st.just("t")}, optional={
    "v": _JSON_LEAVES | st.lists(_JSON_LEAVES, max_size=3) | st.fixed_dictionaries({"x": _JSON_LEAVES})}),
    min_size=1, max_size=12))
def test_a_type_clash_names_the_field_and_two_records_that_disagree(tmp_path_factory, records):
    """Where Parquet cannot type a field, the message names it and two lines whose values there are of different
    JSON kinds (a plain walk down the named path says so); where it can, the inference succeeds."""
    import re

    from diversity_order import arrow_json, writers
    from diversity_order.errors import UserError
    from diversity_order.records import scan_jsonl

    folder = tmp_path_factory.mktemp("clash")
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    source = scan_jsonl(folder / "in.jsonl", progress=False)

    def shape(value):  # what Arrow types the column by: a list or an object as such, whatever it holds
        return [] if isinstance(value, list) else {} if isinstance(value, dict) else value

    column = [shape(r.get("v")) for r in records]
    try:
        pa.array(column)  # pyarrow's own verdict on the column
        typed = True
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        # Integers only, one past 2**63 - 1 and none negative: unsigned 64-bit integers.
        typed = all(v is None or type(v) is int for v in column) and all(v is None or 0 <= v < 1 << 64 for v in column)
    if typed and any(type(v) is int and v >= 1 << 63 for v in column):
        [(path, _)] = writers.write_curated(source, np.arange(len(records)), folder / "out.parquet", "parquet")
        assert pq.read_schema(path).field("v").type == pa.uint64()
    if typed:
        # A column of one kind: what lies inside it of two kinds (or past 64 bits, or {} only) is held as JSON text,
        # as datasets holds it, and every record reads back as written.
        [(path, _)] = writers.write_curated(source, np.arange(len(records)), folder / "out.parquet", "parquet")
        assert [row.get("v") for row in arrow_json.rows(pq.read_table(path))] == [r.get("v") for r in records]
        return
    with pytest.raises(UserError) as caught:
        writers.parquet_schema(source, np.arange(len(records)))
    huge = re.search(r"field '(v[^']*)' is an integer past 64 bits at .*in\.jsonl:(\d+),", str(caught.value))
    both = re.search(r"field '(v[^']*)' holds (.+?) at .*in\.jsonl:(\d+) and (.+?) at .*in\.jsonl:(\d+):",
                     str(caught.value))
    said = huge or both or re.search(r"field '(v[^']*)' is (.+?) at .*in\.jsonl:(\d+) but (.+?) at .*in\.jsonl:(\d+)\)",
                                     str(caught.value))
    assert said, str(caught.value)
    path = said.group(1)

    def kinds(value, steps):  # every value at the path's steps ("[]": each item of a list, ".x": field x)
        if not steps:
            return [] if value is None else [value]
        step, rest = steps[0], steps[1:]
        if step == "[]":
            return [k for item in value for k in kinds(item, rest)] if isinstance(value, list) else []
        return kinds(value.get(step[1:]), rest) if isinstance(value, dict) else []

    steps = re.findall(r"\[\]|\.[^.\[]+", path[1:])
    if both:  # two numbers no one Parquet type holds exactly: a plain look at the two records says which
        first, second = (kinds(records[int(both.group(i)) - 1].get("v"), steps) for i in (3, 5))
        if both.group(2) == "an integer past 2**63 - 1":  # a column's own integers only
            assert path == "v" and both.group(4) == "a negative integer"
            assert any(type(v) is int and v >= 1 << 63 for v in first) and any(type(v) is int and v < 0 for v in second)
        else:
            assert both.group(2) == "an integer past 2**53" and both.group(4) == "a floating-point number"
            assert any(type(v) is int and abs(v) > 1 << 53 for v in first) and any(isinstance(v, float) for v in second)
        return

    def kind(value):
        return "bool" if isinstance(value, bool) else "number" if isinstance(value, int | float) else type(value).__name__

    if huge:
        values = kinds(records[int(huge.group(2)) - 1].get("v"), steps)
        assert any(isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1 << 63 for v in values)
        return
    lines = int(said.group(3)), int(said.group(5))
    found = [{kind(v) for v in kinds(records[line - 1].get("v"), steps)} for line in lines]
    assert len(found[0] | found[1]) >= 2, (path, lines, records)
    assert lines[1] <= lines[0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({"text": st.just("t")}, optional={
    "v": _JSON_LEAVES | st.lists(_JSON_LEAVES, max_size=3) | st.fixed_dictionaries({"x": _JSON_LEAVES}),
    "w": _JSON_LEAVES}), min_size=1, max_size=12), st.data())
def test_a_clash_said_from_parts_is_the_one_said_from_all_records(tmp_path_factory, records, data):
    """torchrun ranks each find where their own records first hold each JSON kind; what is said from their parts is
    what one process says from all the records (the first record that disagrees, and where the field first held
    another kind), wherever the records are cut."""
    from diversity_order import writers
    from diversity_order.records import scan_jsonl

    folder = tmp_path_factory.mktemp("parts")
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    source = scan_jsonl(folder / "in.jsonl", progress=False)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(records)), max_size=3)))
    bounds = [0, *cuts, len(records)]
    parts = [writers.kinds_at_fields(source, np.arange(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    assert writers.clash_in(parts) == writers._first_clash(source, np.arange(len(records)))


def test_records_parquet_cannot_hold_fail_before_embedding(tmp_path, demo_records, tiny_model_dir, capsys,
                                                            monkeypatch):
    """Converting JSONL to Parquet, a field Parquet cannot hold is found when the input is read, not after hours of
    embedding (the embedder is never called)."""
    from diversity_order import embed

    def never(*args, **kwargs):
        raise AssertionError("embedded before the records were checked")

    monkeypatch.setattr(embed, "embed_and_count", never)
    for name, extra in (("clash", [{"e": 1}, {"e": "x"}]), ("huge", [{"e": 1}, {"e": 1 << 70}])):
        records = [{"text": r["text"], **extra[i % 2]} for i, r in enumerate(demo_records)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        err = run_error(capsys, "--input", tmp_path / f"{name}.jsonl", "--output", tmp_path / name / "c.parquet",
                        "--model-dir", tiny_model_dir, *COMMON)
        assert "cannot be one Parquet table" in err and "--output-format jsonl" in err
        if name == "huge":
            assert f"field 'e' is an integer past 64 bits at {tmp_path / name}.jsonl:2" in err
        if name == "clash":  # the second record has "x", the first 1
            assert f"field 'e' is a string at {tmp_path / name}.jsonl:2 but a number at {tmp_path / name}.jsonl:1" in err
        assert not (tmp_path / name).exists() or not list((tmp_path / name).glob("*.parquet*"))
    # A lone surrogate (JSON can escape one; UTF-8 cannot hold it): said with its field and line, in a value or a key
    for name, raw in (("surrogate", '{"text": "t", "meta": {"s": ["ok", "\\udc00"]}}'),
                      ("key", '{"text": "t", "meta": {"\\ud800": 1}}')):
        lines = [json.dumps({"text": r["text"]}) for r in demo_records]
        lines[7] = raw
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        err = run_error(capsys, "--input", tmp_path / f"{name}.jsonl", "--output", tmp_path / name / "c.parquet",
                        "--model-dir", tiny_model_dir, *COMMON)
        where = "field 'meta.s[]'" if name == "surrogate" else "a key 'meta.\\ud800'"
        assert f"({where} at {tmp_path / name}.jsonl:8 holds a lone surrogate" in err, err


def test_jsonl_converted_to_parquet_has_its_columns_in_input_order_whatever_the_order_written(tmp_path):
    """The columns are in the order the input first has them (as curate infers them), not the order written."""
    from diversity_order import writers
    from diversity_order.records import scan_jsonl

    records = [{"text": "a", "x": 1}, {"text": "b", "y": "q"}, {"z": True, "text": "c"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    source = scan_jsonl(tmp_path / "in.jsonl", progress=False)
    for order in ([2, 1, 0], [1, 2, 0], [0, 1, 2]):
        [(path, _)] = writers.write_curated(source, np.array(order), tmp_path / "out.parquet", "parquet")
        assert pq.read_schema(path).names == ["text", "x", "y", "z"]
        assert writers.parquet_schema(source, np.arange(3)) == pq.read_schema(path).remove_metadata()


_WORDS = st.sampled_from(["a", "b", "c", "city", "query"])
_ARGUMENTS = st.dictionaries(_WORDS, st.text(max_size=3), max_size=3)
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=5)},
                                 optional={"arguments": _ARGUMENTS, "tool_calls": st.lists(
                                     st.fixed_dictionaries({"name": _WORDS, "arguments": _ARGUMENTS}), max_size=2)})
_CHAT_RECORD = st.fixed_dictionaries({"messages": st.lists(_MESSAGE, min_size=1, max_size=3)},
                                     optional={"meta": st.dictionaries(_WORDS, st.integers(0, 9), max_size=2),
                                               "id": st.integers(0, 99)})


@given(records=st.lists(_CHAT_RECORD, min_size=1, max_size=12), data=st.data())
@settings(max_examples=60, deadline=None)
def test_jsonl_written_as_parquet_reads_back_as_the_records_whatever_their_keys(tmp_path_factory, records, data):
    """Objects whose keys differ (tool-call arguments of different functions) were typed as one struct of every
    key, so each read back with the keys it lacks as null, which a chat template printing them prints. They are
    now held as JSON text, as datasets holds them: every record reads back as written (a key missing at the top
    reads as null, as a column), and the documents' fingerprints are the JSONL's."""
    from diversity_order import arrow_json, writers
    from diversity_order.records import scan_jsonl

    folder = tmp_path_factory.mktemp("uneven")
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    source = scan_jsonl(folder / "in.jsonl", "messages", progress=False)
    order = np.array(data.draw(st.permutations(range(len(records)))))
    [(path, _)] = writers.write_curated(source, order, folder / "out.parquet", "parquet")
    back = arrow_json.rows(pq.read_table(path))
    columns = pq.read_schema(path).names
    assert back == [{name: records[i].get(name) for name in columns} for i in order]
    parquet = scan_parquet_source(path)
    assert [parquet.fingerprints[j] for j in range(len(records))] == [source.fingerprints[i] for i in order]


def scan_parquet_source(path):
    from diversity_order.sources import open_source

    return open_source(path, "messages", progress=False)


def test_datasets_reads_tool_call_arguments_written_as_parquet_as_they_were(tmp_path):
    """The reviewer's case: arguments of different functions, and a record's tools. Read back with datasets (what
    TRL loads), each object has its own keys, not the other functions' as null."""
    datasets = pytest.importorskip("datasets")
    from diversity_order import writers
    from diversity_order.records import scan_jsonl

    call = lambda name, arguments: {"role": "assistant", "content": "", "tool_calls": [  # noqa: E731
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}
    records = [{"messages": [{"role": "user", "content": "weather?"}, call("weather", {"city": "Paris"})],
                "tools": [{"name": "weather", "parameters": {"city": {"type": "string"}}}]},
               {"messages": [{"role": "user", "content": "find"}, call("search", {"query": "os", "n": 3})],
                "tools": [{"name": "search", "parameters": {"query": {"type": "string"}, "n": {"type": "integer"}}}]},
               {"messages": [{"role": "user", "content": "plain"}]},
               # the same key a string in one call and an object in another (refused before; datasets takes it)
               {"messages": [{"role": "user", "content": "weather?"}, call("weather", {"city": {"name": "Paris"}})]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    source = scan_jsonl(tmp_path / "in.jsonl", "messages", progress=False)
    [(path, _)] = writers.write_curated(source, np.arange(len(records)), tmp_path / "out.parquet", "parquet")
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train",
                                   cache_dir=str(tmp_path / "hf_cache"))
    assert [dict(row) for row in loaded] == [{"tools": None} | record for record in records]
    # And a Parquet file datasets wrote from the JSONL (its JSON columns) reads as the JSONL's records.
    datasets.load_dataset("json", data_files=str(tmp_path / "in.jsonl"), split="train",
                          cache_dir=str(tmp_path / "hf_cache")).to_parquet(str(tmp_path / "by_datasets.parquet"))
    assert list(scan_parquet_source(tmp_path / "by_datasets.parquet").fingerprints) == list(source.fingerprints)


def test_records_parquet_cannot_hold_are_one_line(tmp_path):
    from diversity_order import arrow_json, writers
    from diversity_order.errors import UserError
    from diversity_order.records import scan_jsonl

    for name, records in (("clash", [{"text": "a", "e": 1}, {"text": "b", "e": "x"}]),):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        with pytest.raises(UserError, match="cannot be one Parquet table"):
            writers.write_curated(scan_jsonl(tmp_path / f"{name}.jsonl", progress=False), np.arange(len(records)),
                                  tmp_path / f"{name}.parquet", "parquet")
        assert not list(tmp_path.glob(f"*{name}*.parquet*"))  # nothing half-written left
    # An object that is {} in every record (a struct of no fields, which Parquet cannot write) is held as JSON text.
    (tmp_path / "empty.jsonl").write_text(json.dumps({"text": "a", "c": {}}) + "\n")
    [(path, _)] = writers.write_curated(scan_jsonl(tmp_path / "empty.jsonl", progress=False), np.arange(1),
                                        tmp_path / "empty.parquet", "parquet")
    assert arrow_json.rows(pq.read_table(path)) == [{"text": "a", "c": {}}]


def test_an_input_starting_with_a_byte_order_mark_is_said(tmp_path, demo_records, tiny_model_dir, caplog):
    """A reviewer's byte-for-byte check found the first record one BOM short in the output, without a word."""
    src = tmp_path / "bom.jsonl"
    lines = [json.dumps(r).encode() for r in demo_records[:40]]
    src.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING):
        assert curate("--input", src, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir, *COMMON) == 0
    assert f"1 input file(s) start with a UTF-8 byte order mark ({src}): it is not part of a record" in caplog.text
    assert sorted((tmp_path / "o.jsonl").read_bytes().splitlines()) == sorted(lines)


def test_a_byte_order_mark_inside_a_file_is_said_as_such(tmp_path, demo_records, tiny_model_dir, capsys):
    """A reviewer's two files with a BOM each, joined with cat: "Unexpected UTF-8 BOM (decode using utf-8-sig)"
    named the line but gave Python's advice."""
    src = tmp_path / "joined.jsonl"
    part = b"\xef\xbb\xbf" + b"".join(json.dumps(r).encode() + b"\n" for r in demo_records[:20])
    src.write_bytes(part + part)
    err = run_error(capsys, "--input", src, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir, *COMMON)
    assert err.startswith(f"error: {src}:21: starts with a UTF-8 byte order mark, which only a file's first line may "
                          "(files with one each joined into one"), err


def test_a_datasets_folder_without_its_state_file_is_said_to_be_one(tmp_path, demo_records, tiny_model_dir, capsys):
    """A reviewer's save_to_disk folder lacking state.json was read as JSONL: "dataset_info.json:1: not valid JSON"."""
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    datasets.Dataset.from_list(demo_records[:30]).save_to_disk(str(folder))
    (folder / "state.json").unlink()
    capsys.readouterr()  # datasets' progress bar
    err = run_error(capsys, "--input", folder, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir)
    assert err.startswith(f"error: --input {folder}: holds Arrow files (data-00000-of-00001.arrow) but is no datasets "
                          f"folder ({folder / 'state.json'} is missing")
    # A folder holding a whole datasets folder: named, not said to lack a state.json it has (a reviewer's)
    whole = tmp_path / "outer" / "ds"
    datasets.Dataset.from_list(demo_records[:30]).save_to_disk(str(whole))
    capsys.readouterr()
    err = run_error(capsys, "--input", whole.parent, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir)
    assert err == f"error: --input {whole.parent}: holds the datasets folder {whole}; give that folder as --input"


def test_a_binary_text_column_is_said_to_be_binary(tmp_path, tiny_model_dir, capsys):
    """A reviewer's Parquet of bytes in its text column was told the field "is a JSON bytes"."""
    source = tmp_path / "b.parquet"
    pq.write_table(pa.table({"text": pa.array([b"\xff\x00", b"ok"], pa.binary())}), source)
    err = run_error(capsys, "--input", source, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir)
    assert "field 'text' is binary data (bytes), expected a string" in err


def test_parquet_nan_written_as_jsonl_is_said(tmp_path, demo_records, tiny_model_dir, caplog):
    """A reviewer's Parquet scores of NaN and Infinity were written as bare NaN/Infinity without a word: Python's json
    and this tool read them back, strict JSON readers do not."""
    rows = [dict(r, score=float("nan") if i % 7 == 0 else float("inf") if i % 11 == 0 else i / 3,
                 blob=bytes([255, i]) if i % 4 == 0 else None) for i, r in enumerate(demo_records[:40])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "n.parquet")
    with caplog.at_level(logging.WARNING):
        assert curate("--input", tmp_path / "n.parquet", "--output", tmp_path / "o.jsonl", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    non_finite = sum(i % 7 == 0 or i % 11 == 0 for i in range(40))
    assert f"{tmp_path / 'o.jsonl'}: {non_finite} record(s) hold NaN or Infinity" in caplog.text
    back = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert sum(not np.isfinite(r["score"]) for r in back) == non_finite
    # Binary values, as text (said: they read back as strings)
    assert f"{tmp_path / 'o.jsonl'}: 10 record(s) hold binary values, which JSON has no type for" in caplog.text
    assert sorted(r["blob"] for r in back if r["blob"] is not None) == sorted(
        bytes([255, i]).decode("utf-8", "backslashreplace") for i in range(0, 40, 4))


def test_parquet_string_and_binary_views_are_read_and_written(tmp_path, demo_records, tiny_model_dir):
    """A tester's Parquet of string_view text (or a binary_view column) failed after the whole run, as it was
    written: Arrow cannot take rows of a view. They are read as large strings and binaries."""
    texts = [r["text"] for r in demo_records[:40]]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string_view()),
                             "blob": pa.array([bytes([i]) for i in range(40)], pa.binary_view())}), tmp_path / "v.parquet")
    for name in ("o.parquet", "o.jsonl"):
        assert curate("--input", tmp_path / "v.parquet", "--output", tmp_path / name.split(".")[1] / name,
                      "--model-dir", tiny_model_dir, *COMMON) == 0
    back = pq.read_table(tmp_path / "parquet" / "o.parquet")
    assert back.schema.field("text").type == pa.large_string()
    assert sorted(zip(back.column("text").to_pylist(), back.column("blob").to_pylist())) == \
        sorted(zip(texts, [bytes([i]) for i in range(40)]))
    lines = [json.loads(line) for line in (tmp_path / "jsonl" / "o.jsonl").read_text().splitlines()]
    assert sorted(r["text"] for r in lines) == sorted(texts)


def test_parquet_files_with_a_column_dictionary_encoded_in_one_only_are_read_as_one(tmp_path, demo_records,
                                                                                    tiny_model_dir):
    """One shard written from pandas categoricals (dictionary-encoded text and source) beside one of plain strings:
    the same values, read alike; they were refused as of different schemas. A single file keeps its encoding."""
    texts = [r["text"] for r in demo_records[:60]]
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.table({"text": pa.array(texts[:30]).dictionary_encode(),
                             "meta": pa.array([{"src": "a"}] * 30, pa.struct([("src", pa.dictionary(pa.int8(), pa.string()))]))}),
                   folder / "a.parquet")
    pq.write_table(pa.table({"text": pa.array(texts[30:]), "meta": pa.array([{"src": "b"}] * 30)}), folder / "b.parquet")
    few = ("--n-clusters", 4, "--seq-len", 4096)
    for name in ("o.parquet", "o.jsonl"):
        assert curate("--input", folder, "--output", tmp_path / name.split(".")[1] / name, "--model-dir",
                      tiny_model_dir, *few) == 0
    back = pq.read_table(tmp_path / "parquet" / "o.parquet")
    assert back.schema.field("text").type == pa.string()
    assert sorted(zip(back.column("text").to_pylist(), back.column("meta").to_pylist())) == \
        sorted(zip(texts, [{"src": "a"}] * 30 + [{"src": "b"}] * 30))
    lines = [json.loads(line) for line in (tmp_path / "jsonl" / "o.jsonl").read_text().splitlines()]
    assert sorted((r["text"], r["meta"]["src"]) for r in lines) == sorted(zip(texts, ["a"] * 30 + ["b"] * 30))
    assert curate("--input", folder / "a.parquet", "--output", tmp_path / "one" / "o.parquet", "--model-dir",
                  tiny_model_dir, *few) == 0
    assert pa.types.is_dictionary(pq.read_table(tmp_path / "one" / "o.parquet").schema.field("text").type)


def test_parquet_inputs_no_table_can_hold_are_one_line(tmp_path, demo_records, tiny_model_dir, capsys):
    """A tester's tracebacks: a column name twice in one file, unsigned 64-bit integers past 2**63 - 1 in one file
    and signed ones in another (after the whole run, as it was written), an empty datasets folder."""
    import datasets

    texts = [r["text"] for r in demo_records[:30]]
    pq.write_table(pa.Table.from_arrays([pa.array(texts), pa.array(texts)], names=["text", "text"]), tmp_path / "d.parquet")
    (tmp_path / "ids").mkdir()
    pq.write_table(pa.table({"text": texts[:15], "x": pa.array([(1 << 64) - 1] * 15, pa.uint64())}),
                   tmp_path / "ids" / "a.parquet")
    pq.write_table(pa.table({"text": texts[15:], "x": pa.array([-1] * 15, pa.int64())}), tmp_path / "ids" / "b.parquet")
    datasets.Dataset.from_list([{"text": "t"}]).select([]).save_to_disk(str(tmp_path / "empty"))
    capsys.readouterr()  # datasets' progress bar
    said = {name: run_error(capsys, "--input", tmp_path / name, "--output", tmp_path / "o" / "c.parquet",
                            "--model-dir", tiny_model_dir, *COMMON) for name in ("d.parquet", "ids", "empty")}
    assert said["d.parquet"] == (f"error: --input {tmp_path / 'd.parquet'}: holds the column 'text' twice: a record "
                                 "cannot hold a field twice; give each column its own name")
    assert "'x' holds unsigned 64-bit integers past 2**63 - 1 in a.parquet and signed integers in another" in said["ids"]
    assert said["empty"] == f"error: --input {tmp_path / 'empty'}: no rows (a datasets folder with no data files)"
    # The same inside a column (a reviewer's: a struct's field, a list's items; and a struct's field name twice).
    for name, big, small in (("struct", pa.array([{"h": (1 << 64) - 1 - i} for i in range(15)],
                                                 pa.struct([("h", pa.uint64())])),
                              pa.array([{"h": i} for i in range(15)], pa.struct([("h", pa.int64())]))),
                             ("list", pa.array([[(1 << 64) - 1]] * 15, pa.list_(pa.uint64())),
                              pa.array([[-1]] * 15, pa.list_(pa.int64())))):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"text": texts[:15], "x": big}), tmp_path / name / "a.parquet")
        pq.write_table(pa.table({"text": texts[15:], "x": small}), tmp_path / name / "b.parquet")
        err = run_error(capsys, "--input", tmp_path / name, "--output", tmp_path / "o" / "c.jsonl", "--model-dir",
                        tiny_model_dir, *COMMON)
        assert f"'{'x.h' if name == 'struct' else 'x[]'}' holds unsigned 64-bit integers past 2**63 - 1 in a.parquet" \
            in err
    pq.write_table(pa.Table.from_arrays([pa.array(texts), pa.array([{"x": 1, "y": 2}] * 30, pa.struct(
        [("x", pa.int64()), ("x", pa.int64())]))], names=["text", "m"]), tmp_path / "twice.parquet")
    assert run_error(capsys, "--input", tmp_path / "twice.parquet", "--output", tmp_path / "o" / "c.jsonl", "--model-dir",
                     tiny_model_dir, *COMMON).endswith("its column 'm' holds the field 'x' twice: a record cannot hold a "
                                                       "field twice; give each field its own name")
    # Unsigned values a signed integer holds join as before.
    pq.write_table(pa.table({"text": texts[:15], "x": pa.array([5] * 15, pa.uint64())}), tmp_path / "ids" / "a.parquet")
    assert curate("--input", tmp_path / "ids", "--output", tmp_path / "ok" / "c.parquet", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    assert sorted(pq.read_table(tmp_path / "ok" / "c.parquet").column("x").to_pylist()) == [-1] * 15 + [5] * 15


def test_integers_beside_fractions_read_back_as_written_or_are_said(tmp_path, demo_records, tiny_model_dir, caplog):
    """A reviewer's tool-call argument "temperature" of 1 in some calls and 0.5 in others became doubles in Parquet:
    1.0 read back, another text for a template printing it, so half the rows were embedded again. Inside a field
    such values are JSON text now; a record's own field of them stays a double column, said."""
    from diversity_order import arrow_json

    records = [{"text": r["text"], "score": 1 if i % 2 else 0.5,
                "call": {"name": "search", "arguments": {"query": f"q{i}", "temperature": 1 if i % 2 else 0.5}}}
               for i, r in enumerate(demo_records[:40])]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with caplog.at_level(logging.WARNING):
        assert curate("--input", tmp_path / "c.jsonl", "--output", tmp_path / "o.parquet", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    assert "Parquet: 'score' holds integers in some records and fractions in others: the column is of doubles" \
        in caplog.text
    back = arrow_json.rows(pq.read_table(tmp_path / "o.parquet"))
    assert sorted(json.dumps(r["call"]) for r in back) == sorted(json.dumps(r["call"]) for r in records)
    assert sorted(repr(r["score"]) for r in back) == sorted(["1.0"] * 20 + ["0.5"] * 20)


def test_records_nested_past_what_parquet_readers_open_are_refused(tmp_path, tiny_model_dir, capsys):
    """A tester's field of 60 nested lists was written as a Parquet file that no reader (pyarrow, this tool) opens."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text("".join(json.dumps({"text": f"record {i}", "v": json.loads("[" * 60 + str(i) + "]" * 60)}) + "\n"
                            for i in range(8)))
    err = run_error(capsys, "--input", deep, "--output", tmp_path / "o" / "c.parquet", "--model-dir", tiny_model_dir,
                    "--n-clusters", 1)
    assert err.startswith(f"error: {deep}: the records cannot be one Parquet table (a Parquet file of these columns "
                          "could not be read back: Parquet schema too deeply nested")
    assert not (tmp_path / "o" / "c.parquet").exists()


def test_unsigned_64_bit_ids_survive_parquet_to_jsonl_and_back(tmp_path, demo_records, tiny_model_dir):
    """A reviewer's uint64 ids past 2**63 - 1 (64-bit hashes) did not come back from Parquet -> JSONL -> Parquet:
    Arrow types Python integers as signed. A column of integers with one past 2**63 - 1 is unsigned now."""
    ids = [(1 << 64) - 1 - i if i % 3 else i for i in range(40)]
    pq.write_table(pa.table({"text": [r["text"] for r in demo_records[:40]], "id": pa.array(ids, pa.uint64()),
                             "small": pa.array(range(40), pa.uint64())}), tmp_path / "in.parquet")
    assert curate("--input", tmp_path / "in.parquet", "--output", tmp_path / "a" / "o.jsonl", "--model-dir",
                  tiny_model_dir, *COMMON) == 0
    assert curate("--input", tmp_path / "a" / "o.jsonl", "--output", tmp_path / "b" / "o.parquet", "--model-dir",
                  tiny_model_dir, *COMMON) == 0
    back = pq.read_table(tmp_path / "b" / "o.parquet")
    assert back.schema.field("id").type == pa.uint64() and sorted(back.column("id").to_pylist()) == sorted(ids)
    assert back.schema.field("small").type == pa.int64()  # none past 2**63 - 1: signed, as Arrow types them


def test_parquet_maps_written_as_jsonl_are_said(tmp_path, demo_records, tiny_model_dir, caplog):
    """Map columns become lists of [key, value] pairs in JSON; a reviewer found that done without a word."""
    from diversity_order.writers import map_columns

    kinds = pa.map_(pa.string(), pa.int64())
    table = pa.table({"text": [r["text"] for r in demo_records[:30]],
                      "tags": pa.array([[("a", i), ("b", 2 * i)] for i in range(30)], kinds),
                      "meta": pa.array([{"inner": [[("k", i)]]} for i in range(30)],
                                       pa.struct([("inner", pa.list_(kinds))]))})
    assert map_columns(table.schema) == ["tags", "meta.inner"]
    assert map_columns(pa.schema([("text", pa.string()), ("n", pa.list_(pa.int64()))])) == []
    pq.write_table(table, tmp_path / "m.parquet")
    with caplog.at_level(logging.WARNING):
        assert curate("--input", tmp_path / "m.parquet", "--output", tmp_path / "o.jsonl", "--model-dir",
                      tiny_model_dir, *COMMON) == 0
    assert f"{tmp_path / 'o.jsonl'}: tags, meta.inner are Arrow maps, which JSON has no type for" in caplog.text
    back = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert sorted(r["tags"][1][1] for r in back) == sorted(2 * i for i in range(30))


@pytest.mark.parametrize("values", [(9007199254740993, 0.5), (0.25, -(2**60)), (1, 0.5, {"v": 2**54 + 1})])
def test_an_integer_a_double_cannot_hold_beside_fractions_names_the_field(tmp_path, tiny_model_dir, capsys, values):
    """A reviewer's {"v": 9007199254740993} beside {"v": 0.5} was refused with Arrow's words, naming no field or line."""
    records = [{"text": f"record {i}", "v": v} if not isinstance(v, dict) else {"text": f"record {i}", "meta": v}
               for i, v in enumerate(values)]
    if isinstance(values[-1], dict):  # nested: the fraction there too
        records[0] = {"text": "record 0", "meta": {"v": 0.5}}
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    if isinstance(values[-1], dict):
        # Inside a field, integers beside fractions are held as JSON text: written, and read back exactly.
        from diversity_order import arrow_json

        assert curate("--input", source, "--output", tmp_path / "o.parquet", "--model-dir", tiny_model_dir,
                      "--n-clusters", 1) == 0
        back = arrow_json.rows(pq.read_table(tmp_path / "o.parquet"))
        assert sorted(json.dumps(_without_nulls(r), sort_keys=True) for r in back) == sorted(
            json.dumps(r, sort_keys=True) for r in records)
        return
    err = run_error(capsys, "--input", source, "--output", tmp_path / "o.parquet", "--model-dir", tiny_model_dir,
                    "--n-clusters", 1)
    path = "v"
    big = next(i for i, r in enumerate(records) if isinstance(r.get("v"), int) and abs(r["v"]) > 1 << 53)
    assert f"field '{path}' holds an integer past 2**53 at {source}:{big + 1} and a floating-point number at " \
        f"{source}:" in err
    assert err.endswith("write JSONL instead (--output-format jsonl)")
    # the integers alone are an int64 column: written
    integers = tmp_path / "i.jsonl"
    integers.write_text('{"text": "x", "v": 1152921504606846976}\n{"text": "y", "v": 3}\n')
    assert curate("--input", integers, "--output", tmp_path / "i.parquet", "--model-dir", tiny_model_dir,
                  "--n-clusters", 1) == 0
    assert pq.read_table(tmp_path / "i.parquet").column("v").to_pylist() == [2**60, 3]


def test_a_parquet_output_named_without_a_suffix_reads_back(tmp_path, demo_jsonl, tiny_model_dir):
    """--output x --output-format parquet writes Parquet named x; given as --input it was refused as JSONL ("looks
    like a Parquet file"): a name of neither format is read by its first bytes."""
    assert curate("--input", demo_jsonl, "--output", tmp_path / "o" / "x", "--output-format", "parquet",
                  "--model-dir", tiny_model_dir, *COMMON) == 0
    assert (tmp_path / "o" / "x").read_bytes()[:4] == b"PAR1"
    assert curate("--input", tmp_path / "o" / "x", "--output", tmp_path / "back.jsonl", "--model-dir", tiny_model_dir,
                  *COMMON) == 0
    assert sorted((tmp_path / "back.jsonl").read_bytes().splitlines()) == \
        sorted(Path(demo_jsonl).read_bytes().splitlines())


def test_an_output_that_is_not_a_plain_file_path_is_refused(tmp_path, demo_jsonl, tiny_model_dir, capsys,
                                                            monkeypatch):
    """A reviewer's --output /dev/stdout (as root) replaced the link with a regular file and wrote the run's files
    into /dev; --output - wrote files named '-' and '-_meta.json'; an output linked to a file elsewhere was replaced
    by a local file, and the trainer reading the link's target kept the old order. Each is one line before work."""
    import compare_clusterings
    import extract_deep_embeddings

    monkeypatch.chdir(tmp_path)
    target = tmp_path / "shared" / "real.jsonl"
    target.parent.mkdir()
    target.write_text('{"text": "old"}\n')
    (tmp_path / "link.jsonl").symlink_to(target)
    os.mkfifo(tmp_path / "pipe.jsonl")
    said = {
        "-": "--output -: this run writes files (the output and its metadata beside it), not to standard output",
        "link.jsonl": f"--output link.jsonl: a symbolic link (to {target}); writing replaces the link, not the file",
        "pipe.jsonl": "--output pipe.jsonl: not a regular file (a device, pipe or socket)"}
    for output, message in said.items():
        err = run_error(capsys, "--input", demo_jsonl, "--output", output, "--model-dir", tiny_model_dir, *COMMON)
        assert err.startswith(f"error: {message}"), err
    assert target.read_text() == '{"text": "old"}\n' and (tmp_path / "link.jsonl").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.jsonl", "link.jsonl", "pipe.jsonl", "shared"]
    # the other scripts' outputs too
    np.save(tmp_path / "e.npy", np.eye(20, dtype=np.float32))
    (tmp_path / "r.json").symlink_to(tmp_path / "shared" / "r.json")
    assert run_main(compare_clusterings.main, ["--shallow", "e.npy", "--deep", "e.npy", "--json", "r.json"]) == 2
    assert "--json r.json: a symbolic link" in capsys.readouterr().err
    assert run_main(extract_deep_embeddings.main, ["--input", str(demo_jsonl), "--output", "-", "--model-dir",
                                                   str(tiny_model_dir)]) == 2
    assert capsys.readouterr().err.startswith("error: --output -: this run writes files")


def test_an_input_read_through_dev_caches_its_token_counts_beside_the_output(tmp_path, demo_jsonl, tiny_model_dir):
    """A reviewer's --input /dev/stdin < data.jsonl, run as root, wrote stdin_token_counts.* into /dev."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1", DIVERSITY_ORDER_CACHE_DIR="")
    before = set(os.listdir("/dev"))
    with demo_jsonl.open("rb") as stdin:
        done = subprocess.run([sys.executable, str(root / "curate_dataset.py"), "--input", "/dev/stdin", "--output",
                               str(tmp_path / "o.jsonl"), "--model-dir", str(tiny_model_dir), "--no-plot",
                               "--no-progress", *map(str, COMMON)], stdin=stdin, env=env, capture_output=True,
                              text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(os.listdir("/dev")) - before == set()
    assert (tmp_path / "o_token_counts.npy").is_file()
    assert "The input is read through a system folder (/dev/stdin): its token counts are cached beside the output" \
        in done.stderr
    assert sorted((tmp_path / "o.jsonl").read_bytes().splitlines()) == sorted(demo_jsonl.read_bytes().splitlines())
