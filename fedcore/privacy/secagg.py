"""Secure aggregation, simulated honestly and exactly: the server learns the sum of the cohort's
quantized updates and nothing else, and every byte of the protocol is counted.

The protocol is SecAgg (Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", its honest-but-curious version: no signatures, no
consistency-check round) over the complete communication graph; SecAgg+ (Bell et al. 2020)
would mask only along a k-regular graph, the same code with fewer pairs. Per round:

0. AdvertiseKeys: client i sends two X25519 public keys, c_i (to encrypt shares) and s_i (to
   agree mask seeds); the server broadcasts the list (the clients that sent are U1).
1. ShareKeys: i draws a self-mask seed b_i, splits b_i and its private key s_i^SK into t-of-|U1|
   Shamir shares (``fedcore.privacy.shamir``) and sends each other client j its two shares,
   AES-GCM-encrypted under a key agreed from c_i^SK and c_j: the server only forwards
   ciphertexts (the senders are U2).
2. MaskedInputCollection: i sends y_i = x_i + PRG(b_i) + sum_{j in U2, j != i} +-PRG(s_ij) mod
   2^32 (+ if i < j, - if i > j), x_i its fixed-point update (``fedcore.privacy.fixedpoint``),
   s_ij the X25519 agreement of s_i^SK and s_j (the senders are U3).
3. Unmasking: the server sends U3; each survivor returns, for every i in U2, its share of b_i if
   i is in U3, else of s_i^SK (never both for one client; it refuses if |U3| < t). From t shares
   the server rebuilds b_i of the survivors and s_i^SK of the dropped, removes the survivors'
   self masks and the dropped clients' pairwise masks, and holds sum_{i in U3} x_i exactly.

Deterministic by design, for reproducible runs: every private key and seed is derived with HKDF
from (run seed, round, client) and the PRG is ChaCha20 keyed by a 32-byte seed (the keystream
of zeros, read as little-endian uint32). A deployment would draw them from os.urandom; in a
simulation the secrecy under test is what the server object receives, which is only bytes:
public keys, ciphertexts addressed to others, masked vectors and the unmasking shares.

Bytes: every message is ``len()`` of the bytes serialised, counted per direction (client to
server: upload; server to client: download) and per stage.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fedcore.errors import ConfigError, FedaptError
from fedcore.privacy import shamir
from fedcore.privacy.fixedpoint import FixedPoint

ID = struct.Struct("<I")
KEY_BYTES = 32
ADVERT_BYTES = ID.size + 2 * KEY_BYTES  # id, c_pk, s_pk
NONCE = b"\0" * 12  # each AES-GCM key is agreed per (round, sender, receiver) and used once
SHARE_PLAIN_BYTES = 2 * ID.size + 2 * shamir.SHARE_BYTES  # sender, receiver, s^SK share, b share
SHARE_CIPHER_BYTES = SHARE_PLAIN_BYTES + 16  # + the GCM tag
SELF_MASK, SECRET_KEY = 0, 1  # kinds of unmasking share
STAGES = ("keys", "shares", "masked", "unmask")


class SecAggAborted(FedaptError):
    """Too few clients survived to unmask the round (fewer than the threshold)."""


def check_threshold(threshold: object, cohort: int) -> None:
    """t must be a majority of the cohort and at most the cohort. Below a majority, two
    disjoint groups of t clients could each answer the unmasking, so a server that announced
    different dropout sets to them could collect both a client's self-mask seed and its mask
    key, and unmask its update; above the cohort nothing could ever be unmasked."""
    low = cohort // 2 + 1
    if cohort < 2:
        raise ConfigError(
            f"privacy.secagg_threshold: secure aggregation needs at least 2 clients per round "
            f"(got {cohort})"
        )
    if (
        not isinstance(threshold, int)
        or isinstance(threshold, bool)
        or not low <= threshold <= cohort
    ):
        raise ConfigError(
            f"privacy.secagg_threshold must be an integer in [{low}, {cohort}] for a cohort of "
            f"{cohort} (a majority, at most the cohort; got {threshold!r})"
        )


# --- primitives -------------------------------------------------------------------------------


def derive_key(seed: int, round_: int, client: int, tag: str) -> bytes:
    """32 bytes from (run seed, round, client, tag) (HKDF-SHA256; see the module docstring)."""
    info = f"fedapt/secagg/{tag}/{round_}/{client}".encode()
    return HKDF(hashes.SHA256(), KEY_BYTES, b"fedapt-secagg", info).derive(str(seed).encode())


def _agree(private: X25519PrivateKey, public: bytes, purpose: bytes) -> bytes:
    shared = private.exchange(X25519PublicKey.from_public_bytes(public))
    return HKDF(hashes.SHA256(), KEY_BYTES, None, b"fedapt/secagg/" + purpose).derive(shared)


def _public(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def prg(seed: bytes, length: int) -> np.ndarray:
    """``length`` uniform elements of Z_{2^32}: ChaCha20 keyed by ``seed`` (32 bytes), zero
    nonce, its keystream read as little-endian uint32."""
    stream = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(stream.update(b"\0" * (4 * length)), dtype="<u4").astype(np.uint32)


def _ids(data: bytes) -> list[int]:
    return [ID.unpack_from(data, at)[0] for at in range(0, len(data), ID.size)]


# --- the client ---------------------------------------------------------------------------------


class SecAggClient:
    """One cohort member's side of a round; ``x`` is its quantized update (uint32)."""

    def __init__(self, cid: int, x: np.ndarray, *, threshold: int, seed: int, round_: int) -> None:
        self.cid, self.x, self.threshold = cid, np.asarray(x, dtype=np.uint32), threshold
        self._c_sk = X25519PrivateKey.from_private_bytes(derive_key(seed, round_, cid, "c"))
        self._s_sk = X25519PrivateKey.from_private_bytes(derive_key(seed, round_, cid, "s"))
        self._b = derive_key(seed, round_, cid, "b")
        self._share_seed = derive_key(seed, round_, cid, "shamir")
        self._peers: dict[int, tuple[bytes, bytes]] = {}  # id -> (c_pk, s_pk), U1
        self._inbox: dict[int, bytes] = {}  # sender -> ciphertext of its shares for me, U2
        self._own: tuple[bytes, bytes] = (b"", b"")  # my shares of my own s^SK and b

    def advertise(self) -> bytes:
        return ID.pack(self.cid) + _public(self._c_sk) + _public(self._s_sk)

    def share_keys(self, broadcast: bytes) -> bytes:
        for at in range(0, len(broadcast), ADVERT_BYTES):
            cid = ID.unpack_from(broadcast, at)[0]
            c_pk = broadcast[at + ID.size : at + ID.size + KEY_BYTES]
            self._peers[cid] = (c_pk, broadcast[at + ID.size + KEY_BYTES : at + ADVERT_BYTES])
        u1 = sorted(self._peers)
        if len(u1) < self.threshold:
            raise SecAggAborted(f"only {len(u1)} clients advertised keys, fewer than t")
        s_secret = int.from_bytes(self._s_sk.private_bytes_raw(), "little")
        s_shares = shamir.split(s_secret, len(u1), self.threshold, self._share_seed + b"s")
        b_shares = shamir.split(int.from_bytes(self._b, "little"), len(u1), self.threshold,
                                self._share_seed + b"b")  # fmt: skip
        out = []
        for x, j in enumerate(u1):  # party j holds the shares at x + 1
            pair = shamir.share_to_bytes(s_shares[x]) + shamir.share_to_bytes(b_shares[x])
            if j == self.cid:
                self._own = (pair[: shamir.SHARE_BYTES], pair[shamir.SHARE_BYTES :])
                continue
            key = _agree(self._c_sk, self._peers[j][0], b"share-encryption")
            header = ID.pack(self.cid) + ID.pack(j)
            out.append(ID.pack(j) + AESGCM(key).encrypt(NONCE, header + pair, header))
        return b"".join(out)

    def masked_input(self, forwarded: bytes) -> bytes:
        record = ID.size + SHARE_CIPHER_BYTES
        for at in range(0, len(forwarded), record):
            sender = ID.unpack_from(forwarded, at)[0]
            self._inbox[sender] = forwarded[at + ID.size : at + record]
        if len(self._inbox) + 1 < self.threshold:
            raise SecAggAborted(f"only {len(self._inbox) + 1} clients shared keys, fewer than t")
        y = self.x + prg(self._b, self.x.size)  # uint32: wraps mod 2^32
        for j in sorted(self._inbox):  # U2 without me
            mask = prg(_agree(self._s_sk, self._peers[j][1], b"pairwise-mask"), self.x.size)
            y = y + mask if self.cid < j else y - mask
        return ID.pack(self.cid) + y.astype("<u4").tobytes()

    def unmask(self, survivors: bytes) -> bytes:
        u3 = set(_ids(survivors))
        u2 = set(self._inbox) | {self.cid}
        if len(u3) < self.threshold or not u3 <= u2:
            raise SecAggAborted(f"client {self.cid} refuses to unmask: U3 is invalid or under t")
        out = []
        for i in sorted(u2):
            if i == self.cid:
                s_share, b_share = self._own
            else:
                key = _agree(self._c_sk, self._peers[i][0], b"share-encryption")
                header = ID.pack(i) + ID.pack(self.cid)
                plain = AESGCM(key).decrypt(NONCE, self._inbox[i], header)[len(header) :]
                s_share, b_share = plain[: shamir.SHARE_BYTES], plain[shamir.SHARE_BYTES :]
            kind, share = (SELF_MASK, b_share) if i in u3 else (SECRET_KEY, s_share)
            out.append(ID.pack(i) + bytes([kind]) + share)
        return b"".join(out)


# --- the server ---------------------------------------------------------------------------------


@dataclass
class SecAggServer:
    """The aggregator: it sees only the bytes in ``received`` (kind, bytes) and sends
    ``sent``. ``length`` (coordinates per update) and ``threshold`` are public."""

    length: int
    threshold: int
    received: list[tuple[str, bytes]] = field(default_factory=list)
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    _adverts: dict[int, bytes] = field(default_factory=dict)
    _shares: dict[int, dict[int, bytes]] = field(default_factory=dict)  # receiver -> sender -> ct
    _u2: set[int] = field(default_factory=set)  # the clients that sent shares
    _masked: dict[int, np.ndarray] = field(default_factory=dict)
    _unmasking: dict[int, bytes] = field(default_factory=dict)

    def _got(self, kind: str, msg: bytes) -> bytes:
        self.received.append((kind, msg))
        return msg

    def _send(self, kind: str, msg: bytes) -> bytes:
        self.sent.append((kind, msg))
        return msg

    def receive_keys(self, msg: bytes) -> None:
        self._adverts[ID.unpack_from(self._got("keys", msg))[0]] = msg

    def key_broadcast(self) -> bytes:
        return self._send("keys", b"".join(self._adverts[i] for i in sorted(self._adverts)))

    def receive_shares(self, sender: int, msg: bytes) -> None:
        """``sender`` is known from the authenticated channel, as in the paper."""
        self._got("shares", msg)
        record = ID.size + SHARE_CIPHER_BYTES
        for at in range(0, len(msg), record):
            to = ID.unpack_from(msg, at)[0]
            self._shares.setdefault(to, {})[sender] = msg[at + ID.size : at + record]
        self._u2.add(sender)

    def forward_shares(self, to: int) -> bytes:
        inbox = self._shares.get(to, {})
        return self._send("shares", b"".join(ID.pack(i) + inbox[i] for i in sorted(inbox)))

    def receive_masked(self, msg: bytes) -> None:
        self._got("masked", msg)
        y = np.frombuffer(msg, dtype="<u4", offset=ID.size).astype(np.uint32)
        if y.size != self.length:
            raise ValueError(f"a masked vector has {y.size} coordinates, not {self.length}")
        self._masked[ID.unpack_from(msg)[0]] = y

    def survivors(self) -> bytes:
        return self._send("unmask", b"".join(ID.pack(i) for i in sorted(self._masked)))

    def receive_unmasking(self, sender: int, msg: bytes) -> None:
        self._unmasking[sender] = self._got("unmask", msg)

    def aggregate(self, round_: int = 0) -> np.ndarray:
        """sum_{i in U3} x_i mod 2^32, after removing every mask."""
        if len(self._unmasking) < self.threshold:
            raise SecAggAborted(
                f"round {round_}: {len(self._unmasking)} clients answered the unmasking, fewer "
                f"than privacy.secagg_threshold={self.threshold}; the round's sum stays masked"
            )
        shares: dict[tuple[int, int], list[tuple[int, int]]] = {}
        step = ID.size + 1 + shamir.SHARE_BYTES
        for msg in self._unmasking.values():
            for at in range(0, len(msg), step):
                owner, kind = ID.unpack_from(msg, at)[0], msg[at + ID.size]
                share = shamir.share_from_bytes(msg[at + ID.size + 1 : at + step])
                shares.setdefault((owner, kind), []).append(share)
        total = np.zeros(self.length, dtype=np.uint32)
        for y in self._masked.values():
            total += y
        u3 = sorted(self._masked)
        dropped = sorted(self._u2 - set(u3))
        for i in u3:
            b = self._secret(shares, i, SELF_MASK)
            total -= prg(b, self.length)
        for d in dropped:
            s_sk = X25519PrivateKey.from_private_bytes(self._secret(shares, d, SECRET_KEY))
            for j in u3:  # j added +PRG(s_jd) if j < d, else -PRG(s_jd): take it back out
                s_pk = self._adverts[j][ID.size + KEY_BYTES : ADVERT_BYTES]
                mask = prg(_agree(s_sk, s_pk, b"pairwise-mask"), self.length)
                total = total - mask if j < d else total + mask
        return total

    def _secret(self, shares: Mapping[tuple[int, int], list[tuple[int, int]]], owner: int,
                kind: int) -> bytes:  # fmt: skip
        got = shares.get((owner, kind), [])
        if len(got) < self.threshold:
            raise SecAggAborted(f"only {len(got)} shares of client {owner}'s mask, fewer than t")
        return shamir.reconstruct(got[: self.threshold]).to_bytes(KEY_BYTES, "little")


# --- one round, with dropouts and byte counts ---------------------------------------------------


@dataclass(frozen=True)
class SecAggRound:
    total: np.ndarray  # sum of the survivors' x_i mod 2^32 (uint32)
    survivors: tuple[int, ...]  # U3
    upload: dict[str, int]  # stage -> bytes sent by clients
    download: dict[str, int]  # stage -> bytes sent by the server
    server: SecAggServer  # what it received, for inspection


def secure_sum(
    inputs: Mapping[int, np.ndarray], *, threshold: int, seed: int, round_: int,
    dropped_after_keys: Iterable[int] = (), dropped_after_sharing: Iterable[int] = (),
    dropped_after_masking: Iterable[int] = (),
) -> SecAggRound:  # fmt: skip
    """One SecAgg round over the cohort ``inputs`` (client id -> uint32 vector); a client in
    ``dropped_after_<stage>`` goes silent after that stage."""
    check_threshold(threshold, len(inputs))
    lengths = {np.asarray(x).size for x in inputs.values()}
    if len(lengths) != 1:
        raise ValueError(f"every client's vector must have the same length (got {lengths})")
    after_keys, after_sharing = set(dropped_after_keys), set(dropped_after_sharing)
    after_masking = set(dropped_after_masking)
    server = SecAggServer(length=lengths.pop(), threshold=threshold)
    clients = {
        cid: SecAggClient(cid, x, threshold=threshold, seed=seed, round_=round_)
        for cid, x in sorted(inputs.items())
    }
    upload, download = dict.fromkeys(STAGES, 0), dict.fromkeys(STAGES, 0)

    live = list(clients)
    for cid in live:  # 0: AdvertiseKeys
        msg = clients[cid].advertise()
        upload["keys"] += len(msg)
        server.receive_keys(msg)
    broadcast = server.key_broadcast()
    live = [c for c in live if c not in after_keys]
    for cid in live:  # 1: ShareKeys
        download["keys"] += len(broadcast)
        msg = clients[cid].share_keys(broadcast)
        upload["shares"] += len(msg)
        server.receive_shares(cid, msg)
    forwarded = {cid: server.forward_shares(cid) for cid in live}
    live = [c for c in live if c not in after_sharing]
    for cid in live:  # 2: MaskedInputCollection
        download["shares"] += len(forwarded[cid])
        msg = clients[cid].masked_input(forwarded[cid])
        upload["masked"] += len(msg)
        server.receive_masked(msg)
    survivors = server.survivors()
    live = [c for c in live if c not in after_masking]
    for cid in live:  # 3: Unmasking
        download["unmask"] += len(survivors)
        msg = clients[cid].unmask(survivors)
        upload["unmask"] += len(msg)
        server.receive_unmasking(cid, msg)
    total = server.aggregate(round_)
    return SecAggRound(total, tuple(_ids(survivors)), upload, download, server)


def secure_sum_updates(
    updates: Mapping[int, Mapping[str, torch.Tensor]], *, clip_range: float, threshold: int,
    seed: int, round_: int, dropped_after_sharing: Iterable[int] = (),
) -> tuple[dict[str, torch.Tensor], SecAggRound]:  # fmt: skip
    """Float updates (client id -> entries, already clipped) through fixed point and SecAgg:
    (the decoded sum of the survivors' encoded updates, the round). Central DP noise, if any,
    is added by the caller after this (the server's noise on the unmasked sum)."""
    codec = FixedPoint(clip_range, len(updates))
    like = next(iter(updates.values()))
    encoded = {cid: codec.encode_update(u) for cid, u in updates.items()}
    done = secure_sum(
        encoded, threshold=threshold, seed=seed, round_=round_,
        dropped_after_sharing=dropped_after_sharing,
    )  # fmt: skip
    return codec.decode_update(done.total, like), done
