"""The reduced draft vocabulary keeps special tokens and maps ids and probabilities back."""

import pytest
import torch
from tiny import tiny_tokenizer

from specpilot.errors import ConfigError, PromptError
from specpilot.models.vocab import DraftVocabulary


def test_first_ids_keep_special_tokens():
    tokenizer = tiny_tokenizer([f"w{i}" for i in range(4, 40)])
    vocabulary = DraftVocabulary.first_ids(2, tokenizer, full_size=40)
    assert vocabulary.token_ids.tolist() == [0, 1, 2, 3]  # ids 0, 1 plus the specials 2 (</s>), 3


def test_mapping_back_to_the_full_vocabulary():
    vocabulary = DraftVocabulary(torch.tensor([7, 2, 5]), full_size=9)
    assert [vocabulary.to_full_id(i) for i in range(3)] == [2, 5, 7]
    full = vocabulary.to_full_probs(torch.tensor([0.2, 0.3, 0.5]))
    assert full.tolist() == pytest.approx([0, 0, 0.2, 0, 0, 0.3, 0, 0.5, 0])
    head = vocabulary.head(torch.arange(9.0)[:, None].expand(9, 4))
    assert head[:, 0].tolist() == [2.0, 5.0, 7.0]


def test_invalid_vocabularies():
    with pytest.raises(ConfigError):
        DraftVocabulary(torch.tensor([3, 12]), full_size=10)
    with pytest.raises(ConfigError):
        DraftVocabulary.first_ids(0, tiny_tokenizer(["a"]), full_size=5)


def test_corpus_vocabulary_takes_the_most_frequent_ids(tmp_path):
    tokenizer = tiny_tokenizer([f"w{i}" for i in range(4, 40)])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"conversations": [{"from": "human", "value": "w30 w30 w30 w12"}]}\n'
        '{"turns": ["w12 w7"], "other": 3}\n'
    )
    ids = [tokenizer.convert_tokens_to_ids(w) for w in ("w30", "w12", "w7")]
    vocabulary = DraftVocabulary.from_corpus(2, tokenizer, 40, corpus)
    # w30 (3 uses), w12 (2); w7 (1) is cut; the specials 0-3 are always in
    assert vocabulary.token_ids.tolist() == [0, 1, 2, 3, ids[1], ids[0]]
    # a size past the corpus's distinct ids fills up with unused ids in id order
    larger = DraftVocabulary.from_corpus(8, tokenizer, 40, corpus)
    assert larger.token_ids.tolist() == [0, 1, 2, 3, 4, ids[2], ids[1], ids[0]]


def test_corpus_vocabulary_errors(tmp_path):
    tokenizer = tiny_tokenizer(["a"])
    with pytest.raises(ConfigError, match="corpus not found"):
        DraftVocabulary.from_corpus(2, tokenizer, 5, tmp_path / "missing.txt")
    empty = tmp_path / "numbers.jsonl"
    empty.write_text('{"id": 3}\n')
    with pytest.raises(ConfigError, match="holds no text"):
        DraftVocabulary.from_corpus(2, tokenizer, 5, empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(PromptError, match="bad.jsonl:1"):
        DraftVocabulary.from_corpus(2, tokenizer, 5, bad)
