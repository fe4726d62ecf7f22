"""What travels each round: a task narrowed to the adapter's payload, and the downloads.

A download is the global model's entries a task names (all of them by default) plus the
server's message to the client (``MESSAGE``-prefixed keys); what the client already holds
(FedNILO's frozen layers, an adapter's frozen base) is not sent again and not counted.
"""

from __future__ import annotations

import dataclasses

from fedcore import payload
from fedcore.algorithms.base import MESSAGE, ClientTask
from fedcore.codecs import Codec, decode_state, encode_state, float_dtype
from fedcore.payload import StateDict


def restrict(
    task: ClientTask, payload_keys: tuple[str, ...] | None, trainable: frozenset[str] | None
) -> ClientTask:
    """Narrow a task to the adapter's payload: only it is downloaded, trained, uploaded."""
    if payload_keys is None:
        return task
    keys = payload_keys
    sent = set(keys)
    down = keys if task.download_keys is None else tuple(k for k in task.download_keys if k in sent)
    up = keys if task.upload_keys is None else tuple(k for k in task.upload_keys if k in sent)
    train = trainable
    if task.trainable is not None:
        train = task.trainable if train is None else task.trainable & train
    return dataclasses.replace(task, download_keys=down, trainable=train, upload_keys=up)


def downloads(
    global_state: StateDict,
    tasks: list[ClientTask],
    *,
    encode: bool = True,
    base_cache: dict[tuple[str, ...], bytes] | None = None,
    codec: Codec | None = None,
    start: StateDict | None = None,
    raw: frozenset[str] = frozenset(),
) -> list[tuple[bytes | None, bytes | None, int]]:
    """(download, held, download bytes) per task; identical plans share one encoding.
    ``encode=False`` (the cohort engine, whose clients read the global model in place):
    no payload, only its size, ``len(encode(...))`` from ``payload.encoded_size``.
    ``base_cache``: the frozen base's encodings under an adapter (they never change).
    ``codec``: the download codec the sent tensors go through (``fedcore.codecs``); what the
    client holds is then ``start``, the global model as the codec decodes it (``raw`` keys
    travel as they are)."""
    cache: dict[tuple, tuple[bytes | None, bytes | None, int]] = {}
    out = []
    for t in tasks:
        key = (t.download_keys, tuple((k, id(v)) for k, v in t.message.items()))
        if key not in cache:
            g = global_state
            keys = list(g) if t.download_keys is None else list(t.download_keys)
            sent = {k: g[k] for k in keys}
            sent.update({MESSAGE + k: v for k, v in t.message.items()})
            if codec is not None:
                sent = encode_state(codec, sent, upload=False, gen=None, raw=raw)
            if not encode:
                cache[key] = (None, None, payload.encoded_size(sent))
                out.append(cache[key])
                continue
            held = None
            if t.download_keys is not None:
                sent_keys = set(keys)
                held_keys = tuple(k for k in g if k not in sent_keys)
                # Under an adapter the held part is the frozen base: encoded once per run.
                held = None if base_cache is None else base_cache.get(held_keys)
                if held is None:
                    h = g if start is None else start  # what the client decoded earlier
                    held = payload.encode({k: h[k] for k in held_keys})
                    if base_cache is not None:
                        base_cache[held_keys] = held
            blob = payload.encode(sent)
            cache[key] = (blob, held, len(blob))
        out.append(cache[key])
    return out


def received(codec: Codec | None, tasks: list[ClientTask]) -> list[ClientTask]:
    """``tasks`` with each server message as a client decodes it through the download
    ``codec`` (the cohort engine's clients read the message from the task)."""
    if codec is None:
        return tasks
    cache: dict[int, dict] = {}
    out = []
    for t in tasks:
        if not t.message:
            out.append(t)
            continue
        if id(t.message) not in cache:
            wire = encode_state(codec, t.message, upload=False, gen=None)
            cache[id(t.message)] = decode_state(codec, wire, float_dtype(t.message))
        out.append(dataclasses.replace(t, message=cache[id(t.message)]))
    return out
