#!/usr/bin/env python3
"""meshtron serve against meshtron generate on the same checkpoint.

    serve_test.py MPIEXEC MESHTRON DECK TOKENIZER_MODEL WORK gpt|t5 LAYOUT

gpt: a decoder-only model; t5: an encoder-decoder (on pp 2: the encoder's
stage, the decoder's stage), whose answer is the decoder's output. LAYOUT:
tensor_parallel or pipeline_parallel, of degree 2 (a GPT on pp 2 decodes
n = 2 samples as two micro-batches in flight).
Greedy text (of a text and of a token-id prompt) equals generate's, and so
does sampled text with the deck's seed (the draws are keyed by seed, prompt
index and position); seeded n = 2 sampling repeats; a stream spells the same text as the whole answer;
malformed JSON and an over-long prompt get 400 and the server keeps
answering; SIGTERM to rank 0 stops every rank with status 0.
"""
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

mpiexec, meshtron, deck, tokenizer_model, work, arch, layout = sys.argv[1:8]
os.makedirs(work, exist_ok=True)
common = [deck, "--set", f"data.tokenizer_model={tokenizer_model}",
          "--set", f"checkpoint.save_dir={work}/ckpt", "--set", f"run.output_dir={work}/run"]
PROMPT = "The jury said"
ID_PROMPT = [5, 7, 11, 3, 19]
if arch == "t5":  # seq_length 16: the encoder's positions
    NAME, TOO_LONG = "serve-t5-test", list(range(17))
else:  # seq_length 32: prompt and completion share it
    NAME, TOO_LONG = "serve-test", list(range(30))
LAYOUT = {layout: 2}
grid = ["--set", "checkpoint.load=auto"]
for key, degree in LAYOUT.items():
    grid += ["--set", f"parallel.{key}={degree}"]


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def run(np, *args):
    out = subprocess.run([mpiexec, "--oversubscribe", "-np", str(np), meshtron, *args],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"{args[0]} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def post(port, body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def health(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        return r.status, json.loads(r.read())


# 1. a checkpoint, and generate's greedy answers on the layout
run(1, "train", *common)
with open(f"{work}/prompts.jsonl", "w") as f:
    f.write(json.dumps({"text": PROMPT}) + "\n" + json.dumps({"ids": ID_PROMPT}) + "\n")
for decoding in ["greedy", "sample"]:
    run(2, "generate", *common, *grid, "--set", f"generate.prompts={work}/prompts.jsonl",
        "--set", f"generate.decoding={decoding}", "--set", f"generate.output={work}/{decoding}.jsonl")
expected = [json.loads(l) for l in open(f"{work}/greedy.jsonl")]
expected_sampled = [json.loads(l) for l in open(f"{work}/sample.jsonl")]

# 2. the server, on a free port
server = subprocess.Popen([mpiexec, "--oversubscribe", "-np", "2", meshtron, "serve", *common, *grid,
                           "--set", "serve.port=0"], stdout=subprocess.PIPE, text=True)
port = pid = None
banner = []
for line in server.stdout:
    banner.append(line)
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+) .*pid (\d+)", line)
    if m:
        port, pid = int(m.group(1)), int(m.group(2))
        break
if port is None:
    fail("no 'listening on' line:\n" + "".join(banner))

try:
    status, h = health(port)
    if status != 200 or h["model"] != NAME or h["arch"] != arch or \
            any(h["layout"][key] != degree for key, degree in LAYOUT.items()):
        fail(f"/health: {status} {h}")

    # 3. greedy: generate's text and token count, for a text and a token-id prompt
    for prompt, want in [(PROMPT, expected[0]), (ID_PROMPT, expected[1])]:
        status, body = post(port, {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                   "logprobs": 0})
        answer = json.loads(body)
        if status != 200 or answer["object"] != "text_completion":
            fail(f"greedy: {status} {body}")
        choice = answer["choices"][0]
        if choice["text"] != want["text"] or \
                answer["usage"]["completion_tokens"] != len(want["ids"]) or \
                answer["usage"]["prompt_tokens"] != len(want["prompt_ids"]):
            fail(f"greedy {answer} differs from generate's {want}")
        if len(choice["logprobs"]["token_logprobs"]) != len(want["ids"]):
            fail(f"logprobs: {choice['logprobs']}")
        print("greedy:", repr(choice["text"]), "ids", want["ids"])

    # 4. sampled with the deck's seed: generate's texts (prompt i: choice i)
    status, body = post(port, {"prompt": [e["prompt_ids"] for e in expected_sampled],
                               "max_tokens": 8, "temperature": 1.0})
    got = [c["text"] for c in json.loads(body)["choices"]] if status == 200 else body
    if got != [e["text"] for e in expected_sampled]:
        fail(f"sampled {got} differs from generate's {expected_sampled}")
    print("sampled like generate:", got)

    # 5. n = 2 sampled with a seed: the same twice
    sampled = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "n": 2, "seed": 11}
    first, second = post(port, sampled), post(port, sampled)
    texts = [c["text"] for c in json.loads(first[1])["choices"]]
    if first[0] != 200 or len(texts) != 2 or \
            texts != [c["text"] for c in json.loads(second[1])["choices"]]:
        fail(f"seeded sampling: {first} {second}")
    print("sampled:", texts)

    # 6. stream: the same text as the whole answer
    status, body = post(port, dict(sampled, stream=True))
    events = [l[len("data: "):] for l in body.split("\n\n") if l.startswith("data: ")]
    if status != 200 or events[-1] != "[DONE]":
        fail(f"stream: {status} {body}")
    streamed = ["", ""]
    for e in events[:-1]:
        c = json.loads(e)["choices"][0]
        streamed[c["index"]] += c["text"]
    if streamed != texts:
        fail(f"streamed {streamed} != {texts}")

    # 7. bad requests: 400 with an invalid_request_error, the server still up
    for name, body, raw in [("malformed JSON", b'{"prompt": "x", ', True),
                            ("over-long prompt", {"prompt": TOO_LONG, "max_tokens": 8}, False),
                            ("max_tokens 0", {"prompt": PROMPT, "max_tokens": 0}, False),
                            ("n over the limit", {"prompt": PROMPT, "n": 100}, False),
                            ("wrong type", {"prompt": PROMPT, "temperature": "hot"}, False)]:
        status, text = post(port, body, raw)
        if status != 400 or json.loads(text)["error"]["type"] != "invalid_request_error":
            fail(f"{name}: {status} {text}")
        print(f"{name}: 400 {json.loads(text)['error']['message']}")
    if health(port)[0] != 200:
        fail("no /health after the bad requests")
finally:
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
    try:
        rest = server.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        server.kill()
        fail("serve did not stop within 30 s of SIGTERM")

if server.returncode != 0 or "received SIGTERM: stopped serving" not in rest:
    fail(f"serve exited {server.returncode}:\n{rest}")
print("PASS")
