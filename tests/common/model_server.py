#!/usr/bin/env python3
"""A scripted model server for the agent tests and scripts/bench-agents.

Serves, over HTTPS (or plain HTTP without --cert):
  POST /v1/messages   the Anthropic Messages API (Claude Code), SSE streaming or JSON
  POST /v1/responses  the OpenAI Responses API (Codex), SSE streaming
Anything else gets a 404 (recorded like the rest).

The script (--script FILE, JSON) is a list of turns, each one of
  {"bash": "COMMAND"}   answer with one call of the agent's shell tool
  {"text": "WORDS"}     answer with text and end the agent's turn
  {"tool": NAME, "input": {...}}  (Anthropic) a call of any other tool (Write...)
The turn is chosen from the request itself, not from a counter: turn N
answers a conversation holding N results of earlier tool calls, so the
agent's side requests (titles, summaries: requests without tools) never
shift the script; they get a short text answer. After the last turn the
agent gets "done".

Every request is appended to --log as one JSON line: method, path,
headers, body (parsed when it is JSON), and the turn it was given, so the
test sees what the agent sent back (its tool results) and which key it
used.

    model_server.py --listen IP:PORT [--cert C --key K] --script S --log L
"""
import argparse
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


def sse(event, data):
    return ("event: %s\ndata: %s\n\n" % (event, json.dumps(data))).encode()


# --- Anthropic Messages ---------------------------------------------------

def anthropic_turn(body):
    """How many tool results the conversation holds (the turn to answer)."""
    n = 0
    for m in body.get("messages", []):
        c = m.get("content")
        if m.get("role") == "user" and isinstance(c, list):
            n += sum(1 for b in c if isinstance(b, dict) and b.get("type") == "tool_result")
    return n


def anthropic_blocks(step, turn):
    if "tool" in step:
        return [{"type": "tool_use", "id": "toolu_%02d" % turn, "name": step["tool"],
                 "input": step["input"]}], "tool_use"
    if "bash" in step:
        return [{"type": "tool_use", "id": "toolu_%02d" % turn, "name": "Bash",
                 "input": {"command": step["bash"], "description": "scripted step %d" % turn}}], "tool_use"
    return [{"type": "text", "text": step.get("text", "done")}], "end_turn"


def anthropic(h, body, script):
    tools = bool(body.get("tools"))
    turn = anthropic_turn(body)
    step = script[turn] if tools and turn < len(script) else {"text": "done" if tools else "ok"}
    blocks, stop = anthropic_blocks(step, turn)
    model = body.get("model", "scripted")
    msg = {"id": "msg_%d_%d" % (turn, time.monotonic_ns()), "type": "message", "role": "assistant",
           "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 10, "output_tokens": 1}}
    if not body.get("stream"):
        msg.update(content=blocks, stop_reason=stop)
        h.reply(200, "application/json", json.dumps(msg).encode())
        return turn
    h.start_stream()
    h.chunk(sse("message_start", {"type": "message_start", "message": msg}))
    for i, b in enumerate(blocks):
        if b["type"] == "tool_use":
            start = dict(b, input={})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}
        else:
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": b["text"]}
        h.chunk(sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}))
        h.chunk(sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
        h.chunk(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    h.chunk(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": 5}}))
    h.chunk(sse("message_stop", {"type": "message_stop"}))
    h.end_stream()
    return turn


# --- OpenAI Responses -----------------------------------------------------

def openai_turn(body):
    inp = body.get("input")
    if not isinstance(inp, list):
        return 0
    return sum(1 for it in inp if isinstance(it, dict) and it.get("type") == "function_call_output")


def openai_shell_tool(body):
    """The name and argument shape of the agent's shell tool, from its tool list."""
    names = [t.get("name") for t in body.get("tools", []) if isinstance(t, dict)]
    for n in ("shell_command", "exec_command", "shell"):
        if n in names:
            return n
    return "shell"


def openai_args(tool, command):
    if tool == "shell_command":
        return {"command": command}
    if tool == "exec_command":
        return {"cmd": command}
    return {"command": ["bash", "-lc", command]}


def openai(h, body, script):
    tools = bool(body.get("tools"))
    turn = openai_turn(body)
    step = script[turn] if tools and turn < len(script) else {"text": "done" if tools else "ok"}
    rid = "resp_%d_%d" % (turn, time.monotonic_ns())
    if "bash" in step:
        tool = openai_shell_tool(body)
        item = {"type": "function_call", "id": "fc_%02d" % turn, "call_id": "call_%02d" % turn,
                "name": tool, "arguments": json.dumps(openai_args(tool, step["bash"])), "status": "completed"}
    else:
        item = {"type": "message", "id": "msg_%02d" % turn, "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": step.get("text", "done"), "annotations": []}]}
    resp = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": body.get("model", "scripted"), "output": []}
    h.start_stream()
    h.chunk(sse("response.created", {"type": "response.created", "response": resp}))
    h.chunk(sse("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                               "item": dict(item, status="in_progress")}))
    if item["type"] == "message":
        h.chunk(sse("response.output_text.delta", {"type": "response.output_text.delta", "item_id": item["id"],
                                                   "output_index": 0, "content_index": 0,
                                                   "delta": item["content"][0]["text"]}))
    h.chunk(sse("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                              "item": item}))
    done = dict(resp, status="completed", output=[item],
                usage={"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                       "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15})
    h.chunk(sse("response.completed", {"type": "response.completed", "response": done}))
    h.end_stream()
    return turn


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, ctype, data):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        path = self.path.split("?")[0]
        turn = None
        script = self.server.script
        if self.command == "POST" and path.endswith("/messages") and isinstance(body, dict):
            turn = anthropic(self, body, script)
        elif self.command == "POST" and path.endswith("/responses") and isinstance(body, dict):
            turn = openai(self, body, script)
        else:
            self.reply(404, "application/json", b'{"error": "not scripted"}')
        rec = {"t": time.time(), "method": self.command, "path": self.path,
               "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body, "turn": turn}
        with LOCK, open(self.server.log, "a") as f:
            f.write(json.dumps(rec) + "\n")

    do_GET = do_POST = do_PUT = do_HEAD = handle_any


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--script", required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    host, port = a.listen.rsplit(":", 1)
    srv = ThreadingHTTPServer((host, int(port)), Handler)
    srv.daemon_threads = True
    with open(a.script) as f:
        srv.script = json.load(f)
    srv.log = a.log
    if a.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.cert, a.key)
        ctx.set_alpn_protocols(["http/1.1"])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
