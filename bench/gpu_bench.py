"""`make bench-gpu`: the worker's engines against one call over all prompts, on random-weight models of real shapes.

Runs where only PyTorch and transformers are installed (plus orch's few pure-Python needs:
docs/BENCHMARKS.md), with no internet: each model is built with random weights from a shape kept
in bench/shapes/ (on a CPU also the tests' tiny Llama), once, into .cache/bench/models. Per model
and engine (transformers; vLLM too where it is installed), in one run:
  (a) the ceiling: one call over all prompts (transformers: one padded `model.generate`; vLLM:
      one `LLM.generate`), on the prompt tokens the worker would build;
  (b) with --old-batches, transformers only: padded batches of 16, one after another (the engine
      before issue 16);
  (c) orch end to end: `orch prepare` -> `orch plan` -> `python -m worker` -> `orch collect` on
      a local store, every custom_id checked exactly once; its throughput over the worker's time
      without the model load (the worker's summary reports load_s);
  (d) with --candidates, transformers only: the library's own continuous batching (`generate_batch`),
      tuned (a KV cache sized to the workload, every prefill in one step): the candidate the
      engine was measured against (docs/BENCHMARKS.md).
Each measurement runs in its own process, so that it has the device to itself; model loads are
timed apart. Prompts are LMSys-length chat turns; every answer is exactly --max-tokens long
(ignore_eos). Variants run in rounds, in a rotated order each round; each keeps its best time.

    python -m bench.gpu_bench [--quick] [--shapes S,...] [--engines transformers,vllm]
                              [--prompts N] [--max-tokens T] [--rounds R] [--old-batches] [--candidates]

On a GPU the defaults are issue 16's: SmolLM2-135M and Llama 1B shapes with 512 prompts, Llama 8B
with 256, 64 tokens each, bfloat16. On a CPU the same script is a smoke run (float32): the tiny
Llama (256 prompts x 32 tokens, best of 3: the transformers engine's CPU target, (c)/(a) >= 0.90)
and the SmolLM2 shape (16 x 16); --quick: the tiny Llama only, 128 x 16, once. Results: bench/results/gpu_bench.json
(gpu_bench_cpu.json on a CPU).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from bench.common import CACHE, ROOT, save, table

SHAPES = ROOT / "bench" / "shapes"
TOKENIZER = SHAPES / "smollm2-135m"  # every shape's tokenizer and chat template
MODELS = CACHE / "models"
TARGET = 0.90
#: shape -> (prompts, tokens per answer, rounds) on a GPU (issue 16's sizes), on a CPU (a smoke
#: run, and the transformers engine's CPU target on the tiny model), and with --quick on a CPU.
SIZES = {
    "gpu": {"smollm2-135m": (512, 64, 1), "llama-1b": (512, 64, 1), "llama-8b": (256, 64, 1)},
    "cpu": {"tiny": (256, 32, 3), "smollm2-135m": (16, 16, 1)},
    "cpu-quick": {"tiny": (128, 16, 1)},
    "cpu-smoke": {"tiny": (16, 8, 1)},
}
OLD_BATCH = 16


# -- models ---------------------------------------------------------------------------------------
def build_model(shape: str, device: str) -> tuple[Path, float]:
    """A random-weight model of `shape` saved as a transformers directory (built once); build seconds."""
    started = time.perf_counter()
    if shape == "tiny":
        from model_builders import build_tiny

        return build_tiny(MODELS / "tiny-llama"), time.perf_counter() - started
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    out = MODELS / f"{shape}-{str(dtype).removeprefix('torch.')}"
    if (out / ".built").exists():
        return out, 0.0
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    config = AutoConfig.from_pretrained(SHAPES / shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(tmp)
    del model
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / name, tmp / name)
    with gzip.open(TOKENIZER / "tokenizer.json.gz") as src, open(tmp / "tokenizer.json", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (tmp / ".built").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out, time.perf_counter() - started


def request_lines(count: int, max_tokens: int) -> list[str]:
    """OpenAI Batch chat requests of LMSys-like first turns, each answered with exactly max_tokens tokens."""
    from bench.worker_bench import conversations

    return [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "temperature": 0.0,
                },
            }
        )
        for i, text in enumerate(conversations(count))
    ]


# -- (a) and (b): one call over all prompts, in a child process -------------------------------------
def ceiling(engine: str, model: str, data: str, old_batches: bool, candidates: bool) -> dict[str, Any]:
    """The child's work: load the engine, build the worker's prompts, time one call over all of them."""
    from orchestrator.core.spec import ModelSpec, SamplingSpec
    from worker.requests import parse_request
    from worker.wire import EngineRequest

    with open(data) as f:
        requests = [parse_request(line, i, SamplingSpec()) for i, line in enumerate(f)]
    assert all(isinstance(r, EngineRequest) for r in requests)
    max_tokens = requests[0].params.max_tokens  # type: ignore[union-attr]
    started = time.perf_counter()
    if engine == "vllm":
        from worker.engine.vllm_engine import VllmEngine

        loaded: Any = VllmEngine(ModelSpec(name=model))
    else:
        from worker.engine.hf_engine import TransformersEngine

        loaded = TransformersEngine(ModelSpec(name=model, engine="transformers"))
    result: dict[str, Any] = {"load_s": time.perf_counter() - started, "accelerator": loaded.accelerator}
    ids = [loaded.prompts.build(r).token_ids for r in requests]
    run = _vllm_call(loaded, max_tokens) if engine == "vllm" else _generate_call(loaded, max_tokens)
    run(ids[:4])  # warm-up: first-call allocations and kernels
    variants: dict[str, tuple[Any, list[list[list[int]]]]] = {"a": (run, [ids])}
    if old_batches and engine == "transformers":
        variants["b"] = (run, [ids[s : s + OLD_BATCH] for s in range(0, len(ids), OLD_BATCH)])
    if candidates and engine == "transformers":
        continuous = _continuous_call(loaded, max_tokens, ids)
        continuous(ids[:4])  # its warm-up: the cache and the manager
        variants["d"] = (continuous, [ids])
    for name, (call, batches) in variants.items():
        started, started_cpu = time.perf_counter(), time.process_time()
        tokens = sum(call(batch) for batch in batches)
        result[name] = {
            "seconds": time.perf_counter() - started,
            "cpu_s": time.process_time() - started_cpu,
            "tokens_out": tokens,
        }
    return result


def _generate_call(engine: Any, max_tokens: int) -> Any:
    import torch

    tokenizer = engine.tokenizer

    def run(batch: list[list[int]]) -> int:
        inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(engine.device)
        with torch.inference_mode():
            out = engine.model.generate(
                **inputs,
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=None,
                suppress_tokens=[tokenizer.eos_token_id],
                pad_token_id=tokenizer.pad_token_id,
            )
        if engine.device == "cuda":
            torch.cuda.synchronize()
        return int((out.shape[1] - inputs["input_ids"].shape[1]) * len(batch))

    return run


def _continuous_call(engine: Any, max_tokens: int, workload: list[list[int]]) -> Any:
    """transformers' own continuous batching (`generate_batch`), tuned to the workload: a KV cache of
    exactly the blocks every prompt needs at once (its default sizes itself from free memory: 21 GB
    on this CPU), and a step budget that takes every prompt's prefill in one step."""
    import math

    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page = 256
    blocks = sum(math.ceil((len(ids) + max_tokens) / page) for ids in workload)
    config = ContinuousBatchingConfig(
        page_size=page,
        num_blocks=blocks + 8,
        max_batch_tokens=max(8192, sum(len(ids) for ids in workload)),
        max_requests_per_batch=len(workload),
    )
    generation = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=None,  # ignore_eos: every answer max_tokens long
        pad_token_id=engine.tokenizer.pad_token_id,
    )

    def run(batch: list[list[int]]) -> int:
        outs = engine.model.generate_batch(
            batch, generation_config=generation, continuous_batching_config=config, progress_bar=False
        )
        return sum(len(o.generated_tokens) for o in outs.values())

    return run


def _vllm_call(engine: Any, max_tokens: int) -> Any:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)

    def run(batch: list[list[int]]) -> int:
        outs = engine.llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    return run


def run_ceiling(engine: str, model: Path, data: Path, old_batches: bool, candidates: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.gpu_bench", "--child", engine, str(model), str(data)]
    out, _ = _run(command + (["--old-batches"] if old_batches else []) + (["--candidates"] if candidates else []))
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# -- (c): orch end to end ---------------------------------------------------------------------------
def orch_end_to_end(engine: str, model: Path, data: Path, expected_tokens: int) -> dict[str, Any]:
    """prepare -> plan -> worker -> collect in a fresh local store; every custom_id back exactly once."""
    work = Path(tempfile.mkdtemp(prefix="orch-gpu-bench-"))
    try:
        spec = work / "orch.yaml"
        spec.write_text(
            json.dumps(  # JSON is YAML
                {
                    "run": "bench",
                    "store": str(work / "store"),
                    "model": {"name": str(model), "engine": engine},
                    "input": {"format": "openai-batch"},
                    # Two chunks: the worker feeds the next while the first drains, as with real, larger chunks.
                    "chunking": {"num_chunks": 2},
                    "workers": {"count": 1, "checkpoint_interval": 30},
                }
            )
        )
        orch = [sys.executable, "-m", "orchestrator"]
        seconds: dict[str, float] = {}
        steps = {
            "prepare": [*orch, "prepare", str(data), "-f", str(spec)],
            "plan": [*orch, "plan", "-f", str(spec)],
            "worker": [
                sys.executable,
                "-m",
                "worker",
                "--run",
                "bench",
                "--store",
                str(work / "store"),
                "--worker",
                "0",
            ],
            "collect": [*orch, "collect", "-f", str(spec), "--out", str(work / "answers.jsonl")],
        }
        for name, command in steps.items():
            started = time.perf_counter()
            out, cpu = _run(command, cwd=work)
            seconds[name] = time.perf_counter() - started
            if name == "worker":
                summary, worker_cpu = json.loads(out.strip().splitlines()[-1]), cpu
        answers = [json.loads(line) for line in (work / "answers.jsonl").read_text().splitlines()]
        ids = [a["custom_id"] for a in answers]
        expected = [json.loads(line)["custom_id"] for line in data.read_text().splitlines()]
        assert sorted(ids) == sorted(expected) and len(set(ids)) == len(ids), "a row missing or answered twice"
        assert not any(a["error"] for a in answers), "error rows"
        tokens = sum(a["response"]["body"]["usage"]["completion_tokens"] for a in answers)
        assert tokens == summary["tokens_out"] == expected_tokens, (tokens, summary["tokens_out"], expected_tokens)
        return {
            "seconds": summary["wall_s"] - summary["load_s"],
            "cpu_s": worker_cpu - summary["load_cpu_s"],
            "tokens_out": tokens,
            "load_s": summary["load_s"],
            "steps_s": {k: round(v, 2) for k, v in seconds.items()},
            "accelerator": summary.get("accelerator"),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(command: list[str], cwd: Path | None = None) -> tuple[str, float]:
    """The child's stdout and its CPU seconds (its own, from wait4)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, cwd=cwd or ROOT, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            sys.stderr.write(err.read()[-4000:])
            raise SystemExit(f"{' '.join(command[:4])}... failed with exit {os.waitstatus_to_exitcode(status)}")
        out.seek(0)
        return out.read(), usage.ru_utime + usage.ru_stime


# -- the benchmark ----------------------------------------------------------------------------------
def measure(
    engine: str, model: Path, data: Path, tokens: int, rounds: int, old_batches: bool, candidates: bool
) -> dict[str, Any]:
    """(a), (b) and (c) for one model and engine, in rounds of rotated order; each keeps its best time."""
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "c": []}
    jobs = {
        "a": lambda: run_ceiling(engine, model, data, old_batches, candidates),
        "c": lambda: orch_end_to_end(engine, model, data, tokens),
    }
    order = list(jobs)
    for r in range(rounds):
        for name in order[r % 2 :] + order[: r % 2]:
            result = jobs[name]()
            if name == "a":
                for variant in ("a", "b", "d"):
                    if variant in result:
                        runs.setdefault(variant, []).append({**result[variant], "load_s": result["load_s"]})
                        _report(engine, variant, r, runs[variant][-1])
            else:
                runs["c"].append(result)
                _report(engine, "c", r, result)
    best = {}
    for name, results in runs.items():
        assert all(x["tokens_out"] == tokens for x in results), (name, [x["tokens_out"] for x in results], tokens)
        best[name] = {
            **min(results, key=lambda x: x["seconds"]),
            "cpu_s": min(x["cpu_s"] for x in results),
            "all_seconds": [round(x["seconds"], 2) for x in results],
            "all_cpu_s": [round(x["cpu_s"], 2) for x in results],
        }
        best[name]["tokens_per_s"] = tokens / best[name]["seconds"]
    return best


def _report(engine: str, variant: str, r: int, result: dict[str, Any]) -> None:
    rate = result["tokens_out"] / result["seconds"]
    print(
        f"  round {r + 1}: {engine} ({variant}) {result['seconds']:.1f} s ({result['cpu_s']:.1f} CPU s), "
        f"{rate:,.0f} tok/s (model load {result['load_s']:.1f} s apart)",
        flush=True,
    )


LABELS = {
    "a": "(a) one call over all prompts",
    "b": f"(b) padded batches of {OLD_BATCH}, one after another",
    "c": "(c) orch worker, end to end",
    "d": "(d) transformers' continuous batching, tuned",
}


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.child:
        engine, model, data = args.child
        print(json.dumps(ceiling(engine, model, data, args.old_batches, args.candidates)))
        return 0
    if args.build:
        path, seconds = build_model(args.build, _device())
        print(json.dumps({"path": str(path), "seconds": seconds}))
        return 0
    device = _device()
    mode = "gpu" if device == "cuda" else "cpu-smoke" if args.smoke else "cpu-quick" if args.quick else "cpu"
    sizes = SIZES[mode]
    shapes = args.shapes.split(",") if args.shapes else list(sizes)
    # A smoke runs the transformers engine alone: vLLM's rows need three engine starts (minutes on a
    # CPU), and worker_bench's and prefix_bench's smokes already run the worker on vLLM.
    with_vllm = _has_vllm() and not args.smoke
    engines = args.engines.split(",") if args.engines else ["transformers"] + (["vllm"] if with_vllm else [])
    results: dict[str, Any] = {"device": device, "mode": mode, "shapes": {}}
    rows = []
    for shape in shapes:
        if shape != "tiny" and not (SHAPES / shape / "config.json").exists():
            raise SystemExit(f"unknown shape {shape!r}: tiny or one of bench/shapes/ ({', '.join(SIZES['gpu'])})")
        count, max_tokens, rounds = sizes.get(shape, min(sizes.values()))
        count, max_tokens, rounds = args.prompts or count, args.max_tokens or max_tokens, args.rounds or rounds
        # Built in a child process too: this one never holds device memory the measured ones need.
        out, _ = _run([sys.executable, "-m", "bench.gpu_bench", "--build", shape])
        built = json.loads(out.strip().splitlines()[-1])
        model, built_s = Path(built["path"]), built["seconds"]
        data = CACHE / f"gpu-bench-{count}x{max_tokens}.jsonl"
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("\n".join(request_lines(count, max_tokens)) + "\n")
        tokens = count * max_tokens
        print(f"{shape}: {count} prompts x {max_tokens} tokens on {device}, model built in {built_s:.1f} s", flush=True)
        entry: dict[str, Any] = {
            "prompts": count,
            "max_tokens": max_tokens,
            "rounds": rounds,
            "model_build_s": round(built_s, 1),
            "engines": {},
        }
        for engine in engines:
            best = measure(engine, model, data, tokens, rounds, args.old_batches, args.candidates)
            for name, result in best.items():
                result["x_ceiling"] = result["tokens_per_s"] / best["a"]["tokens_per_s"]
                # On a shared CPU, wall time swings with the neighbours; CPU time much less.
                result["x_ceiling_cpu"] = best["a"]["cpu_s"] / result["cpu_s"]
                rows.append(
                    [
                        shape,
                        engine,
                        LABELS[name],
                        result["load_s"],
                        result["seconds"],
                        result["tokens_per_s"],
                        result["x_ceiling"],
                        result["cpu_s"],
                        result["x_ceiling_cpu"],
                    ]
                )
            entry["engines"][engine] = {
                "c_over_a": round(best["c"]["x_ceiling"], 3),
                "c_over_a_cpu_time": round(best["c"]["x_ceiling_cpu"], 3),
                "accelerator": best["a"].get("accelerator"),
                "variants": {LABELS[k]: _rounded(v) for k, v in best.items()},
            }
            got = entry["engines"][engine]
            print(
                f"  {shape} {engine}: (c)/(a) = {got['c_over_a']} ({got['c_over_a_cpu_time']} in CPU time)", flush=True
            )
        results["shapes"][shape] = entry
    print(
        table(rows, ["shape", "engine", "", "load s", "best s", "tokens/s", "x ceiling", "CPU s", "x ceiling (CPU s)"])
    )
    hf = [
        e["engines"]["transformers"]["c_over_a"] for e in results["shapes"].values() if "transformers" in e["engines"]
    ]
    if hf:
        print(f"transformers engine (c)/(a): {', '.join(map(str, hf))} (target >= {TARGET})")
    save("gpu_bench" if device == "cuda" else "gpu_bench_cpu", results)
    return 0


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="on a CPU: smaller sizes (a smoke run)")
    parser.add_argument("--smoke", action="store_true", help="as --quick, nothing saved")
    parser.add_argument("--shapes", help=f"comma-separated, of: tiny, {', '.join(sorted(SIZES['gpu']))}")
    parser.add_argument("--engines", help="comma-separated: transformers, vllm (default: both where vLLM is installed)")
    parser.add_argument("--prompts", type=int, help="prompts per shape (default: per shape and device)")
    parser.add_argument("--max-tokens", type=int, help="tokens per answer")
    parser.add_argument(
        "--rounds", type=int, help="repeat each variant, keep the best (default: 2 on a CPU, 1 on a GPU)"
    )
    parser.add_argument("--old-batches", action="store_true", help=f"also (b): padded batches of {OLD_BATCH}")
    parser.add_argument(
        "--candidates", action="store_true", help="also (d): transformers' continuous batching (generate_batch), tuned"
    )
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "MODEL", "DATA"), help=argparse.SUPPRESS)
    parser.add_argument("--build", metavar="SHAPE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
