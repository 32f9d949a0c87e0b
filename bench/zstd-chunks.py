#!/usr/bin/env python3
"""bench/zstd-chunks.py DIR: what chunking costs zstd on a tree, with the zstd tool.

Each regular file under DIR is cut in chunks of C bytes, each chunk compressed
alone (`zstd -L -c --no-check`, one frame), and the sizes summed, for C from
32 KiB to 1 MiB and the whole file at level 3, then levels 1, 6 and 9 at
128 KiB. A per-file model of the codec layer's chunks without its headers
(docs/benchmarks-codec.md, "Space (issue 19)"). Slow: one zstd run per chunk.
"""
import os
import subprocess
import sys

if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if len(sys.argv) == 2 else 2)
d = sys.argv[1]
files = []
for root, _, names in os.walk(d):
    for nm in names:
        files.append(os.path.join(root, nm))
data = [open(f, 'rb').read() for f in files]
def z(b, lvl):
    return len(subprocess.run(['zstd', '-q', f'-{lvl}', '-c', '--no-check'], input=b, capture_output=True).stdout)
cache = {}
def total(C, lvl):
    s = 0
    for b in data:
        if len(b) <= C:
            k = (id(b), lvl)
            if k not in cache: cache[k] = z(b, lvl)
            s += cache[k]
        else:
            s += sum(z(b[i:i+C], lvl) for i in range(0, len(b), C))
    return s
raw = sum(len(b) for b in data)
print(f"{d}: {len(data)} files, {raw} bytes")
for C in (32<<10, 64<<10, 128<<10, 256<<10, 1<<20, 1<<40):
    print(f"  zstd -3, chunk {str(C >> 10) + ' KiB' if C < 1 << 40 else 'whole file'}: {total(C, 3)}")
for lvl in (1, 6, 9):
    print(f"  zstd -{lvl}, chunk 128 KiB: {total(128<<10, lvl)}")
