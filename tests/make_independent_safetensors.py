#!/usr/bin/env python3
"""Writes tests/data/independent.safetensors with nothing but struct and json, as a writer
that shares no code with pipit. tests/safetensors_test.cpp loads it and checks every value.

Run: /usr/bin/python3 tests/make_independent_safetensors.py"""
import json
import os
import struct

tensors = [
    # name, dtype, struct code, shape, values
    ("weight", "F32", "f", [2, 3], [0.5, -1.25, 3.0, 1e-3, -7.5, 42.0]),
    ("indices", "I64", "q", [4], [0, -1, 2**40, 7]),
    ("scale", "F64", "d", [], [3.141592653589793]),
    ("half", "F16", "e", [3], [1.0, -2.5, 0.099975586]),
    ("mask", "BOOL", "?", [2, 2], [True, False, False, True]),
]

header, blobs, offset = {"__metadata__": {"writer": "make_independent_safetensors.py"}}, [], 0
for name, dtype, code, shape, values in sorted(tensors):
    blob = struct.pack("<" + code * len(values), *values)
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
header_bytes = json.dumps(header).encode()
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "independent.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(blobs))
print("wrote", path)
