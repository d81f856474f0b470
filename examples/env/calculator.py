#!/usr/bin/env python3
"""A calculator tool for GSM8K-style problems: an `rlhf --env_command` environment.

The protocol (README, "Multi-turn rollouts"): rlhf writes one JSON object per line on stdin,
    {"id": "17-3", "turn": 0, "prompt": "...", "text": "<completion so far>",
     "action": "<text of the turn that just ended>", "label": <the --label_key value>, "eos": false}
and reads one JSON object per line on stdout, in order:
    {"id": "17-3", "observation": "<text to append>", "done": false, "reward": 1.0}
("reward" and "id" optional; an "id" must be the request's).

This tool:
  * a turn that ends with a call `<calc>EXPR</calc>` (run with --stop_strings '</calc>') gets the
    observation `<result>VALUE</result>` (or `<result>error: ...</result>`) and continues;
  * a turn without a call (or one that ended with EOS) is the final answer: done, with reward 1.0
    when its answer — in the last \\boxed{}, else after the last "####", else the last number
    of the text — equals the label's (a number, or a GSM8K answer "... #### 72"), else 0.0.
EXPR is arithmetic only: numbers, + - * / // % ** and parentheses, evaluated by walking Python's
AST (never eval), with bounds on exponents and sizes. Standard library only; logs go to stderr.

Try it by hand:
    echo '{"id":"0-0","turn":0,"prompt":"","text":"<calc>3*(4+5)</calc>","action":"<calc>3*(4+5)</calc>","label":"#### 27","eos":false}' | python3 examples/env/calculator.py
"""
import ast
import json
import math
import operator
import re
import sys

CALL = re.compile(r"<calc>(.*?)</calc>\s*$", re.S)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
MAX_EXPR_CHARS = 200
MAX_ABS = 1e15

BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expr):
    """The value of an arithmetic expression; ValueError for anything else."""
    expr = expr.replace(",", "").replace("x", "*").replace("×", "*").replace("÷", "/").strip()
    if not expr or len(expr) > MAX_EXPR_CHARS:
        raise ValueError("empty or too long")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError("not arithmetic")

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            return UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and (abs(b) > 16 or abs(a) > 1e6):
                raise ValueError("exponent too large")
            value = BINARY[type(node.op)](a, b)
            if isinstance(value, complex) or abs(value) > MAX_ABS:
                raise ValueError("out of range")
            return value
        raise ValueError("not arithmetic")

    try:
        value = walk(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not finite")
        if value.is_integer():
            value = int(value)
        else:
            value = round(value, 6)
    return value


def number(text):
    """A number as written in an answer ("1,234", "$5", "3.50"), or None."""
    m = NUMBER.search(text.replace("$", ""))
    return float(m.group(0).replace(",", "")) if m else None


def final_answer(text):
    """The final answer of a completion, in rlhf's `math` reward's order: in the last \\boxed{},
    else after the last ####, else the last number."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        return number(boxed[-1])
    if "####" in text:
        return number(text.rsplit("####", 1)[1])
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def label_value(label):
    if isinstance(label, (int, float)):
        return float(label)
    if isinstance(label, str):
        return final_answer(label)
    return None


def answer(request):
    call = None if request.get("eos") else CALL.search(request.get("action", ""))
    if call:
        try:
            result = evaluate(call.group(1))
        except ValueError as e:
            result = f"error: {e}"
        return {"observation": f"<result>{result}</result>", "done": False}
    got, want = final_answer(request.get("action", "")), label_value(request.get("label"))
    correct = got is not None and want is not None and abs(got - want) <= 1e-6 * max(1, abs(want))
    return {"observation": "", "done": True, "reward": 1.0 if correct else 0.0}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        print(json.dumps({"id": request.get("id"), **answer(request)}), flush=True)


if __name__ == "__main__":
    main()
