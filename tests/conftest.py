import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

import json  # noqa: E402
import random  # noqa: E402

import pytest  # noqa: E402

TOPICS = {
    "cooking": "flour butter oven simmer garlic onion saute whisk recipe dough bake sugar pepper skillet broth",
    "astronomy": "galaxy nebula telescope orbit planet comet stellar redshift supernova quasar asteroid lunar eclipse",
    "finance": "equity bond dividend portfolio interest inflation ledger invoice audit liquidity hedge margin yield",
    "football": "goalkeeper penalty midfielder striker offside tackle corner referee league stadium dribble header",
    "music": "melody chord tempo rhythm violin orchestra sonata harmony octave cadence staccato crescendo lyric",
    "python": "def return import lambda yield class self kwargs dict tuple iterator generator decorator module",
}
COMMON = "the of and to in is that for it with as on was this by are be at from or"


def topical_records(per_topic=40, seed=0, long_every=0):
    """Source-grouped synthetic documents: all of one topic, then the next (the 'bad' order)."""
    rng = random.Random(seed)
    records = []
    for topic, words in TOPICS.items():
        vocab = words.split()
        common = COMMON.split()
        for i in range(per_topic):
            length = rng.randint(20, 120) * (10 if long_every and i % long_every == 0 else 1)
            text = " ".join(rng.choice(vocab) if rng.random() < 0.6 else rng.choice(common) for _ in range(length))
            records.append({"text": text, "topic": topic, "id": f"{topic}-{i}"})
    return records


def plain_deal_long(docs, counts):
    """How a pool deals its long documents (``pools.deal_long``), as lists: the shortest (stable by length,
    so ties in ``docs`` order) at the two ends, alternating front and back, shortest outermost, while they
    hold at most a fifth of all their tokens; the others in ``docs`` order between."""
    total = sum(counts[d] for d in docs)
    ends = []
    for d in sorted(docs, key=lambda d: counts[d]):
        if 5 * (sum(counts[e] for e in ends) + counts[d]) > total:
            break
        ends.append(d)
    return ends[0::2] + [d for d in docs if d not in ends] + ends[1::2][::-1]


def write_jsonl(path, records, trailing_newline=True):
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + ("\n" if trailing_newline else ""), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def private_cache_registry(tmp_path_factory, monkeypatch):
    """Each test gets its own cache registry: one test's stored sets must not serve another's
    (nor land in the user's ~/.cache)."""
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(tmp_path_factory.mktemp("cache_registry")))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Llama: a BPE tokenizer trained on topic text and random weights, saved as safetensors."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_model")
    texts = [r["text"] for r in topical_records(per_topic=20, seed=99)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture()
def topical_jsonl(tmp_path):
    return write_jsonl(tmp_path / "data.jsonl", topical_records())
