"""One registry pattern (issue 47): each kind of plug-in is an explicit table read in one
place, and adding one takes the files docs/extending.md says. On a copy of the packages, this
adds one of each kind by writing exactly those files (a new module, the table's line), then
uses each new entry through the public functions, in a fresh process: nothing else needs to
know of it (no registration by import, no if-chain to extend)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# kind -> the files docs/extending.md says adding one takes
FILES = {"algorithm": 2, "adapter": 2, "model": 2, "partition": 2, "codec": 2, "dataset": 2}

NEW = {
    "algorithm": {
        "fedcore/algorithms/fedavg_pow.py": """
            from dataclasses import dataclass
            from typing import Annotated, ClassVar

            from annotated_types import Ge

            from fedcore.algorithms.base import ClientUpdate, FederatedAlgorithm
            from fedcore.options import Float


            @dataclass(frozen=True)
            class FedAvgPow(FederatedAlgorithm):
                name: ClassVar[str] = "fedavg_pow"
                power: Annotated[Float, Ge(0)] = 0.5

                def aggregation_weights(self, updates: list[ClientUpdate]) -> list[float]:
                    return [float(u.num_samples) ** self.power for u in updates]
            """,
        "fedcore/algorithms/__init__.py": [
            (
                "from fedcore.algorithms.fedir import FedIR\n",
                "from fedcore.algorithms.fedavg_pow import FedAvgPow\n"
                "from fedcore.algorithms.fedir import FedIR\n",
            ),
            ("        Scaffold,\n    )", "        Scaffold,\n        FedAvgPow,\n    )"),
        ],
    },
    "adapter": {
        "models/adapters/last_layer.py": '''
            from models.adapters.head import Head


            class LastLayer(Head):
                """The classifier alone, under another name."""

                name = "last_layer"
            ''',
        "models/adapters/__init__.py": [
            (
                "from models.adapters.lora import Lora\n",
                "from models.adapters.last_layer import LastLayer\n"
                "from models.adapters.lora import Lora\n",
            ),
            ("        AccumulatorPA,\n    )", "        AccumulatorPA,\n        LastLayer,\n    )"),
        ],
    },
    "model": {
        "models/tiny.py": """
            from torch import nn

            from models.registry import backbone


            @backbone()
            def tiny(*, num_classes: int, in_channels: int = 3, input_size: int = 32,
                     bias: bool = True) -> nn.Module:
                return nn.Sequential(nn.Flatten(),
                                     nn.Linear(in_channels * input_size**2, num_classes, bias=bias))
            """,
        "models/registry.py": [
            (
                '    "lenet5": ModelEntry("models.cnn:lenet5"),\n',
                '    "lenet5": ModelEntry("models.cnn:lenet5"),\n'
                '    "tiny": ModelEntry("models.tiny:tiny"),\n',
            ),
        ],
    },
    "partition": {
        "fedcore/partition/halves.py": '''
            import numpy as np

            from fedcore.partition.core import Partition, finish, scheme, setup


            @scheme
            def halves(labels: np.ndarray, num_clients: int, seed: int, *, first: float = 0.5):
                """Every client gets the same share of each half of the rows, shuffled."""
                labels, num_clients, seed, rng = setup("halves", labels, num_clients, seed)
                parts = np.array_split(rng.permutation(len(labels)), num_clients)
                return finish("halves", {"num_clients": num_clients, "seed": seed}, parts)
            ''',
        "fedcore/partition/registry.py": [
            (
                "from fedcore.partition import schemes\n",
                "from fedcore.partition import halves, schemes\n",
            ),
            (
                '    "natural": schemes.natural,\n',
                '    "natural": schemes.natural,\n    "halves": halves.halves,\n',
            ),
        ],
    },
    "codec": {
        "fedcore/codecs/sign.py": '''
            from collections.abc import Mapping
            from dataclasses import dataclass
            from typing import ClassVar

            import torch

            from fedcore.codecs.base import Codec


            @dataclass(frozen=True)
            class Sign(Codec):
                """Each value's sign, and one scale per tensor (the mean magnitude)."""

                kind: ClassVar[str] = "sign"

                def encode(self, x, *, upload=True, gen=None):
                    return {"sign": torch.sign(x).to(torch.int8), "scale": x.abs().mean()}

                def decode(self, parts: Mapping[str, torch.Tensor], dtype: torch.dtype):
                    return parts["sign"].to(dtype) * parts["scale"].to(dtype)
            ''',
        "fedcore/codecs/kinds.py": [
            (
                "from fedcore.codecs.base import DIRECTIONS, Codec, Direction\n",
                "from fedcore.codecs.base import DIRECTIONS, Codec, Direction\n"
                "from fedcore.codecs.sign import Sign\n",
            ),
            ('"topk": TopK}', '"topk": TopK, "sign": Sign}'),
        ],
    },
    "dataset": {
        "fedcore/words.py": """
            import torch

            from fedcore.text import TextDataset


            def load_words(info, split):
                texts = ("good", "bad", "fine") if split == "train" else ("ok", "no")
                return TextDataset(texts, torch.arange(len(texts)) % 2, info)
            """,
        "fedcore/datasets.py": [
            (
                '        DatasetInfo("shakespeare",',
                '        DatasetInfo("words", 2, (1, 1, 1), (0.0,), (1.0,), kind="text",\n'
                '                    loader="fedcore.words:load_words"),\n'
                '        DatasetInfo("shakespeare",',
            ),
        ],
    },
}

USE = """
import json, torch
import numpy as np
from fedcore.algorithms import build_algorithm, list_algorithms
from fedcore.codecs import Codecs, make_codec
from fedcore.datasets import list_datasets, load_dataset
from fedcore.partition import make_partition, scheme_options_type
from models import get_model, list_models
from models.adapters import get_adapter, list_adapters

out = {}
algo = build_algorithm("fedavg_pow", {"power": 1.0})
out["algorithm"] = "fedavg_pow" in list_algorithms() and algo.power == 1.0
out["adapter"] = "last_layer" in list_adapters() and get_adapter("last_layer").name == "last_layer"
m = get_model("tiny", num_classes=3, input_size=2, bias=False)
out["model"] = "tiny" in list_models() and m(torch.zeros(1, 3, 2, 2)).shape == (1, 3)
part = make_partition("halves", np.arange(40) % 4, num_clients=4, seed=0, first=0.25)
out["partition"] = part.num_clients == 4 and scheme_options_type("halves")().first == 0.5
codec = Codecs.of(make_codec("sign", {"kind": "sign", "directions": ["upload"]})).upload
x = torch.tensor([1.0, -2.0, 3.0])
out["codec"] = torch.equal(codec.decode(codec.encode(x), torch.float32), torch.tensor([2.0, -2.0, 2.0]))
words = load_dataset("words", "unused", "train")
out["dataset"] = "words" in list_datasets() and len(words.texts) == 3
print(json.dumps(out))
"""


def _add(tree: Path, kind: str) -> set[str]:
    """Add one ``kind`` to ``tree``: its new module and its table's line. Returns the files
    written."""
    touched = set()
    for rel, change in NEW[kind].items():
        path = tree / rel
        if isinstance(change, str):
            assert not path.exists(), rel
            path.write_text(textwrap.dedent(change).lstrip())
        else:
            text = path.read_text()
            for old, new in change:
                assert text.count(old) == 1, f"{rel}: the table's form changed ({old!r})"
                text = text.replace(old, new)
            path.write_text(text)
        touched.add(rel)
    return touched


def test_each_kind_is_added_by_the_files_the_docs_say(tmp_path):
    for package in ("fedcore", "models"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for kind in FILES:
        assert len(_add(tmp_path, kind)) == FILES[kind], kind
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", USE], cwd=tmp_path, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    used = json.loads(res.stdout.splitlines()[-1])
    assert used == dict.fromkeys(FILES, True), used


def test_the_docs_say_those_counts():
    text = " ".join((REPO / "docs/extending.md").read_text().split())
    said = text.split("Files to add one: ", 1)[1].split(" (", 1)[0]
    assert said == ", ".join(f"{k} {n}" for k, n in FILES.items()), said
