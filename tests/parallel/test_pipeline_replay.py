"""The closed-form pipeline composition against a replay of Megatron-LM's schedules.

The oracle below replays, event by event, the two training schedules of Megatron-LM as
Narayanan et al. (SC'21) ran them (``megatron/schedules.py``:
``forward_backward_pipelining_without_interleaving`` and ``..._with_interleaving``, with
``megatron/p2p_communication.py``): every stage-boundary exchange is a group of
``isend``/``irecv`` to the previous and next stage that blocks until all its transfers are
done (``batch_isend_irecv`` then ``wait``), a transfer starting once both ends have posted
it; each tensor through the device's link takes ``x`` (two tensors the same way, ``2x``) and
each received tensor is re-assembled by the scatter/gather all-gather (``g``). Stage 0's
first chunk carries the embedding, stage p−1's last chunk the LM head and loss.

The closed form of :mod:`jaxmodel.parallel.train` is
``m·t_max + bubble_time(t_mean) + p2p_transfers_on_critical_path·(x + g)`` with ``t_max`` the
slowest device's forward+backward per micro-batch and ``t_mean`` the mean over devices.
"""

import collections

import pytest

from jaxmodel.parallel import pipeline as pl


def _chunk(k, p, v, forward):
    c = (k % (p * v)) // p
    return c if forward else v - c - 1


def _warm_up(d, p, v, m):
    """Device ``d``'s interleaved schedule: ``(total, warm-up forwards, is-first-chunk and
    is-last-chunk tests, first ops)`` — the model's first chunk receives no input."""
    total = m * v
    warm = total if m == p else min((p - d - 1) * 2 + (v - 1) * p, total)
    first = lambda c: d == 0 and c == 0          # noqa: E731
    last = lambda c: d == p - 1 and c == v - 1   # noqa: E731
    return total, warm, first, last, [] if first(0) else [("X", [], ["prev"])]


def _interleaved(d, p, v, m):
    """Device ``d``'s operations under the interleaved schedule: ("F"|"B", chunk) computes,
    ("X", sends, receives) exchanges ("next"/"prev")."""
    total, warm, first, last, ops = _warm_up(d, p, v, m)
    for k in range(warm):
        c = _chunk(k, p, v, True)
        ops.append(("F", c))
        rp = not (d == 0 and _chunk(k + 1, p, v, True) == 0) and k != total - 1
        send = [] if last(c) else ["next"]
        rn = k == warm - 1 and m != p and d != p - 1
        ops.append(("X", send, ["prev"] * rp + ["next"] * rn))
    rest = total - warm
    for k in range(rest):
        cf, cb = _chunk(k + warm, p, v, True), _chunk(k, p, v, False)
        ops += [("F", cf), ("B", cb)]
        send = ([] if last(cf) else ["next"]) + ([] if first(cb) else ["prev"])
        rp = not (d == 0 and _chunk(k + warm - (p - 1), p, v, True) == v - 1) and k != rest - 1
        rn = not (d == p - 1 and _chunk(k - (p - 1), p, v, False) == 0)
        ops.append(("X", send, ["prev"] * rp + ["next"] * rn))
    if m == p and d != p - 1:
        ops.append(("X", [], ["next"]))
    for k in range(rest, total):
        cb = _chunk(k, p, v, False)
        ops.append(("B", cb))
        rn = not (d == p - 1 and _chunk(k + 1, p, v, False) == v - 1) and k != total - 1
        ops.append(("X", [] if first(cb) else ["prev"], ["next"] * rn))
    return ops


def _one_f_one_b(d, p, m):
    """Device ``d``'s operations under the non-interleaved 1F1B schedule."""
    warm = min(p - d - 1, m)
    nxt = [] if d == p - 1 else ["next"]
    prv = [] if d == 0 else ["prev"]
    ops = []
    for _ in range(warm):
        ops += [("X", [], prv), ("F", 0), ("X", nxt, [])]
    if m > warm:
        ops.append(("X", [], prv))
    for i in range(m - warm):
        ops += [("F", 0), ("X", nxt, nxt), ("B", 0),
                ("X", prv, [] if i == m - warm - 1 else prv)]
    for _ in range(warm):
        ops += [("X", [], nxt), ("B", 0), ("X", prv, [])]
    return [o for o in ops if o[0] != "X" or o[1] or o[2]]


def replay(p, v, m, f, b, x, g, first=(0.0, 0.0), last=(0.0, 0.0)):
    """Step time of ``m`` micro-batches on ``p`` devices with ``v`` chunks each (``f``/``b``:
    forward/backward of one chunk; ``first``/``last``: the embedding and the LM head added
    to chunk 0 of device 0 and chunk v−1 of device p−1), s."""
    progs = [_interleaved(d, p, v, m) if v > 1 else _one_f_one_b(d, p, m) for d in range(p)]
    peer = lambda d, w: (d + 1) % p if w == "next" else (d - 1) % p   # noqa: E731
    sends, recvs = collections.defaultdict(list), collections.defaultdict(list)
    for d, prog in enumerate(progs):
        for i, op in enumerate(prog):
            if op[0] == "X":
                for w in op[1]:
                    sends[(d, peer(d, w))].append(i)
                for w in op[2]:
                    recvs[(peer(d, w), d)].append(i)
    partner = collections.defaultdict(list)
    for key in set(sends) | set(recvs):     # NCCL matches the k-th send with the k-th recv
        assert len(sends[key]) == len(recvs[key])
        for i, j in zip(sends[key], recvs[key]):
            partner[(key[0], i)].append((key[1], j))
            partner[(key[1], j)].append((key[0], i))
    pc, t, posted = [0] * p, [0.0] * p, {}
    while any(pc[d] < len(progs[d]) for d in range(p)):
        moved = False
        for d in range(p):
            while pc[d] < len(progs[d]):
                op = progs[d][pc[d]]
                if op[0] == "X":
                    posted[(d, pc[d])] = t[d]
                    if any(q not in posted for q in partner[(d, pc[d])]):
                        break
                    start = max([t[d]] + [posted[q] for q in partner[(d, pc[d])]])
                    t[d] = start + x * max(len(op[1]), len(op[2])) + g * len(op[2])
                else:
                    i = 0 if op[0] == "F" else 1
                    extra = ((first[i] if (d, op[1]) == (0, 0) else 0.0)
                             + (last[i] if (d, op[1]) == (p - 1, v - 1) else 0.0))
                    t[d] += (f if op[0] == "F" else b) + extra
                pc[d] += 1
                moved = True
        assert moved, "the schedule deadlocked"
    return max(t)


def closed_form(p, v, m, f, b, x, g, first=(0.0, 0.0), last=(0.0, 0.0)):
    """The composition of :func:`jaxmodel.parallel.train_compose.compose` for these stage
    times."""
    sched = pl.INTERLEAVED if v > 1 else pl.ONE_F_ONE_B
    per_dev = v * (f + b)
    t_max = per_dev + max(sum(first), sum(last)) if p > 1 else per_dev + sum(first) + sum(last)
    t_mean = per_dev + (sum(first) + sum(last)) / p
    n = float(pl.p2p_transfers_on_critical_path(sched, float(p), float(m), float(v)))
    return m * t_max + float(pl.bubble_time(sched, float(p), float(v), t_mean)) + n * (x + g)


def test_replay_hand_case():
    # 1F1B, p = 2, m = 2, f = 1, b = 3, no communication: F0 F1 | B0 F1 B1 | B1 by hand:
    # stage 1 runs F(0) at [1, 2], B(0) [2, 5], F(1) [5, 6], B(1) [6, 9]; stage 0 B(1) [9, 12]
    assert replay(2, 1, 2, 1.0, 3.0, 0.0, 0.0) == pytest.approx(12.0)
    assert closed_form(2, 1, 2, 1.0, 3.0, 0.0, 0.0) == pytest.approx(12.0)


@pytest.mark.parametrize("p,v,m", [(2, 1, 12), (4, 1, 8), (8, 1, 24), (4, 2, 8), (4, 3, 28),
                                   (8, 2, 48), (4, 2, 4)])
def test_closed_form_matches_replay_even_stages(p, v, m):
    # chunk forward/backward of a recomputing layer stack (b ≈ 3f), transfers and re-gathers
    f, b, x, g = 1.0 / v, 3.0 / v, 0.03, 0.02
    got, ref = closed_form(p, v, m, f, b, x, g), replay(p, v, m, f, b, x, g)
    assert got == pytest.approx(ref, rel=0.01)
    assert got >= ref * (1 - 1e-9)           # the closed form never under-estimates here
    # without communication the bubble (p−1)/v·t is exact (PTD-P §2.2.1, §2.2.2)
    assert closed_form(p, v, m, f, b, 0.0, 0.0) == pytest.approx(replay(p, v, m, f, b, 0, 0))


@pytest.mark.parametrize("p,v,m,x,rel", [
    (2, 1, 12, 0.02, 0.01), (8, 1, 24, 0.02, 0.01), (4, 3, 28, 0.02, 0.01),
    (8, 2, 48, 0.02, 0.01),
    # the pipelines of Narayanan et al. SC'21 Table 1's 310B, 530B and 1T runs
    # (examples/sc21/run_table_1.sh): stages, chunks, micro-batches per replica
    (16, 2, 144, 0.01, 0.005), (35, 3, 280, 0.01, 0.005), (64, 1, 512, 0.01, 0.005)])
def test_closed_form_matches_replay_with_embedding_and_head(p, v, m, x, rel):
    # the LM head + loss on the last chunk (~5 % of a device's work, as in Table 1's large
    # rows) and the embedding on the first: the slowest device sets the steady state
    f, b, g = 1.0 / v, 3.0 / v, x / 2
    first, last = (0.01, 0.01), (0.05, 0.14)
    got = closed_form(p, v, m, f, b, x, g, first, last)
    ref = replay(p, v, m, f, b, x, g, first, last)
    assert got == pytest.approx(ref, rel=rel)


def _interleaved_overlap(d, p, v, m):
    """Device ``d``'s operations under the interleaved schedule with Megatron-core's
    ``overlap_p2p_comm`` (Megatron-core 0.7.0 ``schedules.py``,
    ``forward_backward_pipelining_with_interleaving``): ("P", sends, receives, tag) posts an
    asynchronous exchange, ("W", tag) waits for the last one posted under ``tag``; warm-up
    forwards wait for their exchange before the next forward, the steady 1F1B phase waits
    for a forward's exchange after the next backward and vice versa, the cool-down
    exchanges block (("X", ...), as in :func:`_interleaved`)."""
    total, warm, first, last, ops = _warm_up(d, p, v, m)
    for k in range(warm):
        c = _chunk(k, p, v, True)
        ops += [("W", "f"), ("F", c)]
        rp = not (d == 0 and _chunk(k + 1, p, v, True) == 0) and k != total - 1
        ops.append(("P", [] if last(c) else ["next"], ["prev"] * rp, "f"))
        if k == warm - 1 and m != p:
            ops.append(("P", [], ["next"] * (d != p - 1), "b"))
    rest = total - warm
    for k in range(rest):
        cf, cb = _chunk(k + warm, p, v, True), _chunk(k, p, v, False)
        ops += [("W", "f"), ("F", cf)]
        rp = not (d == 0 and _chunk(k + warm - (p - 1), p, v, True) == v - 1) and k != rest - 1
        ops += [("P", [] if last(cf) else ["next"], ["prev"] * rp, "f"), ("W", "b"),
                ("B", cb)]
        rn = not (d == p - 1 and _chunk(k - (p - 1), p, v, False) == 0)
        ops.append(("P", [] if first(cb) else ["prev"], ["next"] * rn, "b"))
    ops += [("W", "b"), ("W", "f")]
    if m == p and d != p - 1:
        ops.append(("X", [], ["next"]))
    for k in range(rest, total):
        cb = _chunk(k, p, v, False)
        ops.append(("B", cb))
        rn = not (d == p - 1 and _chunk(k + 1, p, v, False) == v - 1) and k != total - 1
        ops.append(("X", [] if first(cb) else ["prev"], ["next"] * rn))
    return [o for o in ops if o[0] not in "XP" or o[1] or o[2]]


def replay_overlap(p, v, m, f, b, x, g):
    """:func:`replay` of :func:`_interleaved_overlap`: a posted exchange's transfers start
    once both ends have posted them and take ``x`` per tensor through the link; waiting
    for it costs whatever is left, then ``g`` per received tensor (the re-gather)."""
    progs = [_interleaved_overlap(d, p, v, m) for d in range(p)]
    peer = lambda d, w: (d + 1) % p if w == "next" else (d - 1) % p   # noqa: E731
    sends, recvs = collections.defaultdict(list), collections.defaultdict(list)
    for d, prog in enumerate(progs):
        for i, op in enumerate(prog):
            if op[0] in "XP":
                for w in op[1]:
                    sends[(d, peer(d, w))].append(i)
                for w in op[2]:
                    recvs[(peer(d, w), d)].append(i)
    partner = collections.defaultdict(list)
    for key in set(sends) | set(recvs):
        assert len(sends[key]) == len(recvs[key])
        for i, j in zip(sends[key], recvs[key]):
            partner[(key[0], i)].append((key[1], j))
            partner[(key[1], j)].append((key[0], i))
    pc, t, posted, pending = [0] * p, [0.0] * p, {}, [{} for _ in range(p)]

    def done(d, i):          # completion of exchange i of device d, None until all posted
        if any(q not in posted for q in partner[(d, i)]):
            return None
        op = progs[d][i]
        start = max([posted[(d, i)]] + [posted[q] for q in partner[(d, i)]])
        return start + x * max(len(op[1]), len(op[2]))

    while any(pc[d] < len(progs[d]) for d in range(p)):
        moved = False
        for d in range(p):
            while pc[d] < len(progs[d]):
                op = progs[d][pc[d]]
                if op[0] in "XP":
                    posted.setdefault((d, pc[d]), t[d])
                if op[0] == "X" or op[0] == "W":
                    i = pc[d] if op[0] == "X" else pending[d].pop(op[1], None)
                    if i is not None:
                        end = done(d, i)
                        if end is None:
                            if op[0] == "W":
                                pending[d][op[1]] = i
                            break
                        t[d] = max(t[d], end) + g * len(progs[d][i][2])
                elif op[0] == "P":
                    pending[d][op[3]] = pc[d]
                else:
                    t[d] += f if op[0] == "F" else b
                pc[d] += 1
                moved = True
        assert moved, "the schedule deadlocked"
    return max(t)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 3, 28), (8, 2, 48), (2, 4, 6), (4, 2, 4),
                                   (8, 3, 8)])
def test_overlapped_p2p_matches_replay(p, v, m):
    """Megatron-core ``overlap_p2p_comm``: the closed form (:func:`jaxmodel.parallel.pipeline.
    overlapped_p2p_time`) against the replay of the asynchronous schedule: exact for
    transfers shorter than a chunk (forward 1/v, backward 3/v), within 2 % up to a little
    longer; m = p (all warm-up) overlaps nothing."""
    f, b = 1.0 / v, 3.0 / v
    per_dev = v * (f + b)
    base = m * per_dev + float(pl.bubble_time(pl.INTERLEAVED, float(p), float(v), per_dev))
    for x, rel in ((0.03 / v, 1e-9), (0.5 / v, 1e-9), (1.2 / v, 0.02)):
        got = base + float(pl.overlapped_p2p_time(pl.INTERLEAVED, float(p), float(m),
                                                  float(v), x, (f, b)))
        ref, serial = replay_overlap(p, v, m, f, b, x, 0.0), replay(p, v, m, f, b, x, 0.0)
        if m > p:
            assert got == pytest.approx(ref, rel=rel, abs=1e-6), x
            assert ref < serial
        else:                    # the serial count, as the replay: nothing overlaps
            n = float(pl.p2p_transfers_on_critical_path(pl.INTERLEAVED, float(p), float(m),
                                                        float(v)))
            assert got == pytest.approx(base + n * x) and ref == pytest.approx(serial)
