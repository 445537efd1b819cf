"""`helm test` smoke check: run the trainer once and pass only if its record says status ok.

Usage: python smoke_check.py <trainer args...>   (the args must include --output-dir DIR)
Runs `python -m shardbench.trainer <args>`, echoes its output (so `helm test --logs` shows it), reads the
record printed between the BENCHMARK_RESULT_JSON_START/END lines and DIR/result.json, and exits 1
with one line saying why unless both are there, parse as JSON and have status "ok".
Standard library only: it runs inside the image, which has nothing else to rely on.
"""
import json
import os
import subprocess
import sys

START, END = "BENCHMARK_RESULT_JSON_START", "BENCHMARK_RESULT_JSON_END"


def record_from_stdout(text):
    lines = text.splitlines()
    if START not in lines:
        return None
    body = lines[lines.index(START) + 1:]
    if END not in body:
        return None
    return json.loads("\n".join(body[: body.index(END)]))


def main(argv):
    if "--output-dir" not in argv:
        return "smoke check: pass --output-dir DIR so result.json can be checked too"
    out_dir = argv[argv.index("--output-dir") + 1]
    proc = subprocess.run([sys.executable, "-u", "-m", "shardbench.trainer", *argv],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    try:
        record = record_from_stdout(proc.stdout)
    except ValueError as exc:
        return f"smoke check: the record on stdout is not JSON ({exc})"
    if record is None:
        return f"smoke check: no record between {START} and {END} (trainer exit code {proc.returncode})"
    if record.get("status") != "ok":
        return f"smoke check: status {record.get('status')!r}: {record.get('error')}"
    path = os.path.join(out_dir, "result.json")
    try:
        with open(path) as fh:
            written = json.load(fh)
    except (OSError, ValueError) as exc:
        return f"smoke check: {path} missing or not JSON ({exc})"
    if written.get("status") != "ok":
        return f"smoke check: {path} says status {written.get('status')!r}"
    if proc.returncode != 0:
        return f"smoke check: the trainer exited {proc.returncode} although its record says ok"
    print(f"smoke check: ok ({record.get('run_id')}, {record.get('tokens_per_s')} tokens/s)")
    return None


if __name__ == "__main__":
    problem = main(sys.argv[1:])
    if problem:
        print(problem, file=sys.stderr)
        sys.exit(1)
