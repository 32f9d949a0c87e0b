#!/usr/bin/env python3
"""bench/codec-lower.py: where the space of a codec layer's lower goes.

Usage: bench/codec-lower.py LOWER_DIR [FLOOR_DIR]

Walks LOWER_DIR (the lower directory of a copy/gzip/zstd/lz4 stack, not
mounted) and parses each file's records (docs/codec-format.md): the header
slots, the record headers, delta payloads (fast tails, stored raw), encoded
chunk payloads, chunks stored raw, checkpoints; which files hold no chunk
record at all (only deltas: never compressed), and what the lower file
system charges (st_blocks) against the bytes. With FLOOR_DIR (the same tree
compressed file by file, NAME.zst beside nothing else, e.g. by `zstd -3
--rm`), also what the tree would take with each file one record of
min(zstd -3, raw) bytes behind today's header, in bytes and in 4 KiB blocks.
"""
import os
import struct
import sys

SLOTS, REC = 128, 48
TYPES = {1: "chunk", 2: "delta", 3: "size", 4: "checkpoint"}


def parse(path):
    with open(path, "rb") as f:
        b = f.read()
    recs, off = [], min(SLOTS, len(b))
    while off + REC <= len(b):
        if b[off:off + 3] != b"CZR":
            break
        typ, codec, flags, shift = b[off + 4], b[off + 5], b[off + 6], b[off + 7]
        (plen,) = struct.unpack_from("<I", b, off + 12)
        (arg,) = struct.unpack_from("<Q", b, off + 24)
        (dec,) = struct.unpack_from("<I", b, off + 32)
        recs.append((typ, flags, plen, arg, dec))
        off += REC + plen
    return len(b), recs, off


def blocks(n):
    return (n + 4095) // 4096 * 4096


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    low = sys.argv[1]
    floor = sys.argv[2] if len(sys.argv) > 2 else None
    t = dict(files=0, lower=0, charged=0, slots=0, rechdr=0, trailing=0,
             deltaonly=0, deltaonly_lower=0, deltaonly_logical=0, small=0, small_charged=0, small_lower=0)
    pay = {k: 0 for k in TYPES.values()}
    nrec = {k: 0 for k in TYPES.values()}
    raw_chunks = raw_bytes = 0
    floor_b = floor_blk = 0
    for root, _, names in os.walk(low):
        for n in names:
            p = os.path.join(root, n)
            st = os.lstat(p)
            if not os.path.isfile(p) or os.path.islink(p):
                continue
            size, recs, end = parse(p)
            t["files"] += 1
            t["lower"] += size
            t["charged"] += st.st_blocks * 512
            t["slots"] += min(SLOTS, size)
            t["rechdr"] += REC * len(recs)
            t["trailing"] += size - end
            for typ, flags, plen, arg, dec in recs:
                k = TYPES.get(typ, "?")
                nrec[k] = nrec.get(k, 0) + 1
                pay[k] = pay.get(k, 0) + plen
                if typ == 1 and flags & 1:
                    raw_chunks += 1
                    raw_bytes += plen
            if recs and not any(r[0] == 1 for r in recs):
                t["deltaonly"] += 1
                t["deltaonly_lower"] += size
                t["deltaonly_logical"] += sum(r[2] for r in recs if r[0] == 2)
            if size <= 4096:
                t["small"] += 1
                t["small_lower"] += size
                t["small_charged"] += st.st_blocks * 512
            if floor:
                rel = os.path.relpath(p, low)
                z = os.path.join(floor, rel + ".zst")
                zs = os.path.getsize(z) if os.path.exists(z) else None
                if zs is not None:
                    one = SLOTS + REC + zs
                    floor_b += one
                    floor_blk += blocks(one)
    print(f"files {t['files']}, lower bytes {t['lower']}, charged {t['charged']} ({t['charged'] / max(t['lower'], 1):.2f}x)")
    print(f"header slots {t['slots']}, record headers {t['rechdr']} ({sum(nrec.values())} records), unparsed tail bytes {t['trailing']}")
    for k in TYPES.values():
        print(f"  {k:10s} records {nrec.get(k, 0):7d}  payload {pay.get(k, 0):11d}")
    print(f"  chunks stored raw: {raw_chunks} ({raw_bytes} bytes)")
    print(f"files with deltas only (never compressed): {t['deltaonly']}, {t['deltaonly_lower']} lower bytes, {t['deltaonly_logical']} delta bytes")
    print(f"lower files of at most 4096 bytes: {t['small']}, {t['small_lower']} bytes, charged {t['small_charged']}")
    if floor:
        print(f"model, one record of zstd -3 per file behind today's 128+48 bytes: {floor_b} bytes, {floor_blk} charged in 4 KiB blocks")


main()
