#!/usr/bin/env python3
"""Prints docs/migrating.md's OpenRLHF table (the rows between its header and "Other differences")
from app/openrlhf_names.cpp: each name, and the rlhf flag it is an alias of, or why it is refused
or ignored. tests/e2e/readme.sh checks that every name of the table is in the doc.

Usage: scripts/make_openrlhf_table.py [SOURCE_DIR] > rows.md
"""
import os
import re
import sys

src_dir = sys.argv[1] if len(sys.argv) > 1 else "."
src = open(os.path.join(src_dir, 'app/openrlhf_names.cpp')).read()
consts={}
for m in re.finditer(r'constexpr const char\* (k\w+) =\s*((?:"(?:[^"\\]|\\.)*"\s*)+);', src):
    consts[m.group(1)]=''.join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2)))
cmds={"kTrain":"sft, rm, grpo, ppo","kRl":"grpo, ppo"}
def md(s): return re.sub(r'(?<!`)(--[a-z_][a-z_.0-9]*)', r'`\1`', s)
out=[]
for m in re.finditer(r'^\s*(ALIAS|ALIAS_OR|ALIAS_ELSE_IGNORE|REJECT|IGNORE)\((.*)\),\s*$', src, re.M):
    kind=m.group(1); a=[x.strip().strip('"') for x in m.group(2).split(',')]
    n=a[0]
    if kind=='ALIAS': w=f'`--{a[1]}`'
    elif kind=='ALIAS_OR': w=f'`--{a[1]}` where this build has it, else refused: '+md(consts[a[2]])
    elif kind=='ALIAS_ELSE_IGNORE': w=f'`--{a[1]}` where this build has it, else accepted and ignored ({cmds[a[4]]}): '+md(consts[a[3]])
    elif kind=='REJECT': w='refused: '+md(consts[a[1]])
    else: w=f'accepted and ignored ({cmds[a[3]]}): '+md(consts[a[2]])
    out.append(f'| `--{n}` | {w} |')
print('\n'.join(out))
