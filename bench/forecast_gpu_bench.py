"""The probe forecast's calibration study on a GPU (issue 35): `forecast_bench`'s measurement with
the transformers engine on a random-weight model of a real shape (bench/shapes, as `gpu_bench`).

Made for a GPU machine that has PyTorch and transformers but no vLLM (docs/BENCHMARKS.md, "Running
it on a GPU machine without internet"). One worker per run (one GPU), the engine's batch held at
`max_batch_size: BATCH` so that a probe of two full batches stays within 1.5% of the rows; the
workloads are forecast_bench's kinds at ROWS rows. On a CPU it runs the same study on the tests'
tiny Llama at a tenth of the rows (a smoke run of the script, not a calibration).

    python -m bench.forecast_gpu_bench [--shape smollm2-135m] [--workloads N] [--only NAME]...
"""

from __future__ import annotations

import argparse
import sys

from bench import forecast_bench
from bench.common import CACHE, save

BATCH = 32
ROWS = 4400


def _spec(batch: int) -> str:
    return f"""input:
  format: openai-batch
sampling:
  temperature: 0
model:
  engine: transformers
  engine_args:
    max_batch_size: {batch}
workers:
  heartbeat_interval: 1
  checkpoint_interval: 5
"""


def workloads(rows: int) -> dict[str, forecast_bench.Workload]:
    line, words = forecast_bench._line, forecast_bench._words
    return {
        "short prompts, short outputs": (1, rows, lambda i, r: line(i, words(r, 5, 20), 16)),
        "long prompts, short outputs": (1, rows, lambda i, r: line(i, words(r, 120, 200), 16)),
        "mixed max_tokens": (1, rows, lambda i, r: line(i, words(r, 10, 60), r.choice([8, 24, 48]))),
        # Last: the engine's batches are static, so most batches of 32 run to a row of ~100+ tokens.
        "heavy-tailed outputs": (1, rows, lambda i, r: line(i, words(r, 10, 40), forecast_bench._heavy_tail(r))),
    }


def _gpu_name() -> str | None:
    """The CUDA device's name, None without one (or without PyTorch: the controller's environment)."""
    try:
        import torch
    except ImportError:
        return None
    return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--workloads", type=int, default=3, help="the first N workloads")
    parser.add_argument("--only", action="append", default=[], help="this workload (by name; repeat it), in order")
    parser.add_argument(
        "--smoke", action="store_true", help="the first workload at a hundredth of the rows, nothing saved"
    )
    args = parser.parse_args(argv)
    gpu = _gpu_name()
    cuda = gpu is not None
    if cuda:
        from bench.gpu_bench import build_model

        model, _ = build_model(args.shape, "cuda")
        rows = ROWS
    else:
        model, rows = forecast_bench.MODEL, ROWS // (100 if args.smoke else 10)
    forecast_bench.MODEL = model
    forecast_bench.WORKDIR = CACHE / "forecast_gpu"
    forecast_bench.SPEC = _spec(BATCH if cuda else 8)
    kinds = workloads(rows)
    first = 1 if args.smoke else args.workloads
    chosen = [(n, kinds[n]) for n in args.only] if args.only else list(kinds.items())[:first]
    results, summary = forecast_bench.study(chosen)
    summary.update(device=gpu or "cpu", shape=args.shape if cuda else "tiny-llama")
    forecast_bench.report(results, summary)
    save("forecast_gpu_bench", {"batch": BATCH, "workloads": results, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
