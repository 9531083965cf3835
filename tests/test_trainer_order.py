"""The README's "Keep the order in your trainer" settings, checked against the installed
transformers and TRL: the train dataloader they build on a curated output yields its records in
the curated order (and, without the settings, does not)."""

import json

import numpy as np
import pytest

import curate_dataset
from conftest import topical_records, write_jsonl
from diversity_order.cli import run_main

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
SEQ_LEN = 128


@pytest.fixture()
def curated(tmp_path, tiny_model_dir):
    src = write_jsonl(tmp_path / "data.jsonl", topical_records(per_topic=10, seed=5))
    out = tmp_path / "o" / "c.jsonl"
    assert run_main(curate_dataset.main, [str(a) for a in (
        "--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--seq-len", SEQ_LEN,
        "--no-plot", "--no-progress")]) == 0
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    original = [json.loads(line)["text"] for line in src.read_text().splitlines()]
    assert texts != original  # the order changed, so keeping it is something to check
    return out, texts


def _model_and_tokenizer(model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    return model, tokenizer


def _first_rows(trainer, batches: int) -> list[list[int]]:
    rows = []
    for i, batch in enumerate(trainer.get_train_dataloader()):
        if i == batches:
            break
        for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
            rows.append([t for t, m in zip(ids, mask) if m])
    return rows


@pytest.mark.parametrize("strategy", ["sequential", "random"])
def test_hf_trainer_sequential_sampling_keeps_the_curated_order(tmp_path, tiny_model_dir, curated, strategy):
    out, texts = curated
    model, tokenizer = _model_and_tokenizer(tiny_model_dir)
    dataset = datasets.load_dataset("json", data_files=str(out), split="train")
    dataset = dataset.map(lambda b: tokenizer(b["text"], truncation=True, max_length=SEQ_LEN), batched=True,
                          remove_columns=dataset.column_names)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "t"), per_device_train_batch_size=4,
                                          train_sampling_strategy=strategy, report_to=[], use_cpu=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer))
    expected = [tokenizer(t, truncation=True, max_length=SEQ_LEN)["input_ids"] for t in texts[:12]]
    rows = _first_rows(trainer, 3)
    if strategy == "sequential":
        assert rows == expected
    else:  # the default shuffles: the reason for the setting
        assert rows != expected


def test_trl_wrapped_packing_with_sequential_sampling_keeps_the_curated_order(tmp_path, tiny_model_dir, curated):
    trl = pytest.importorskip("trl")
    out, texts = curated
    model, tokenizer = _model_and_tokenizer(tiny_model_dir)
    dataset = datasets.load_dataset("json", data_files=str(out), split="train").select_columns(["text"])
    args = trl.SFTConfig(output_dir=str(tmp_path / "t"), per_device_train_batch_size=2, packing=True,
                         packing_strategy="wrapped", max_length=SEQ_LEN, train_sampling_strategy="sequential",
                         shuffle_dataset=False, report_to=[], use_cpu=True, dataset_num_proc=None)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    # TRL appends EOS to every text (so: --count-special-tokens eos), concatenates, and cuts every max_length.
    stream = [t for text in texts for t in tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]]
    batches = [batch["input_ids"].reshape(-1).tolist() for _, batch in zip(range(3), trainer.get_train_dataloader())]
    got = [t for batch in batches for t in batch]
    assert got == stream[: len(got)]
    assert np.asarray(batches[0]).size == 2 * SEQ_LEN


def test_trl_on_the_packed_export_trains_its_sequences_in_order(tmp_path, tiny_model_dir):
    """The README's recipe above 1,000 records: SFTTrainer on --export-packed's input_ids, packing off, sampling
    sequential: the train dataloader yields the export's sequences in their order, untouched."""
    trl = pytest.importorskip("trl")
    from glob import glob

    src = write_jsonl(tmp_path / "data.jsonl", topical_records(per_topic=10, seed=5))
    assert run_main(curate_dataset.main, [str(a) for a in (
        "--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 6,
        "--seq-len", SEQ_LEN, "--packing", "split", "--count-special-tokens", "eos", "--export-packed",
        tmp_path / "packed", "--no-plot", "--no-progress")]) == 0
    export = datasets.load_dataset("parquet", data_files=sorted(glob(str(tmp_path / "packed" / "packed-*.parquet"))),
                                   split="train")
    sequences = export["input_ids"]
    assert len(sequences) >= 6 and all(len(s) == SEQ_LEN for s in sequences)
    model, tokenizer = _model_and_tokenizer(tiny_model_dir)
    args = trl.SFTConfig(output_dir=str(tmp_path / "t"), per_device_train_batch_size=2, packing=False,
                         max_length=SEQ_LEN, train_sampling_strategy="sequential", report_to=[], use_cpu=True,
                         dataset_num_proc=None)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=export.select_columns(["input_ids"]),
                             processing_class=tokenizer)
    got = [row for _, batch in zip(range(3), trainer.get_train_dataloader()) for row in batch["input_ids"].tolist()]
    assert got == [list(s) for s in sequences[:6]]
