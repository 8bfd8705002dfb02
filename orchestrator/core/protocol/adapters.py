"""LoRA adapters travel with the run: local adapter directories are copied into the store at launch, workers fetch them.

The spec names each adapter by a local directory or a hub id (`model.lora`). A hub id reaches a
worker the way the model does: the worker downloads it (HF_TOKEN is passed as a secret). A local
directory exists only where `orch launch` runs, so launch copies it into the run
(`adapters/<name>/...`, then `adapters/<name>.json` listing the files with their checksums), and
every worker, local or on a cloud, loads the copy:
1. `ship_adapters` (controller, before any worker starts): copy each local adapter once; an
   adapter whose files changed since is refused (rows already answered used the old one).
2. `fetch_adapters` (worker, before the engine loads): download each shipped adapter into a local
   cache keyed by its checksums (a restarted worker reuses it), checking every file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from orchestrator.core.errors import OrchError, SpecConflict
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import AdapterFile, AdapterManifest, read_record
from orchestrator.core.store import Store


def ship_adapters(store: Store, layout: RunLayout, adapters: dict[str, str]) -> list[str]:
    """Copy every adapter given as a local directory into the run; returns the names copied now."""
    shipped = []
    for name, source in adapters.items():
        directory = Path(source).expanduser()
        if not directory.is_dir():
            continue  # a hub id (or a path that exists only on the workers): loaded where it runs
        manifest = AdapterManifest(name=name, source=source, files=_files(directory))
        found = read_record(store, layout.adapter_manifest(name), AdapterManifest)
        if found is not None:
            if found[0].files != manifest.files:
                raise SpecConflict(
                    f"LoRA adapter {name!r} ({source}) changed since it was shipped with run {layout.run!r}",
                    hint="rows already answered used the shipped copy: start a new run (--run NEW) for the new adapter",
                )
            continue
        for f in manifest.files:
            store.put(layout.adapter_file(name, f.path), (directory / f.path).read_bytes())
        store.put(layout.adapter_manifest(name), manifest.to_bytes())
        shipped.append(name)
    return shipped


def fetch_adapters(store: Store, layout: RunLayout, adapters: dict[str, str], cache: Path) -> dict[str, str]:
    """{name: what the engine loads}: the local copy of a shipped adapter, else the spec's source."""
    out = {}
    for name, source in adapters.items():
        found = read_record(store, layout.adapter_manifest(name), AdapterManifest)
        if found is None:
            out[name] = source
            continue
        manifest = found[0]
        digest = hashlib.sha256("".join(f"{f.path}:{f.sha256};" for f in manifest.files).encode()).hexdigest()[:16]
        target = cache / layout.run / f"{name}-{digest}"
        if not (target / ".complete").exists():
            partial = target.with_name(target.name + f".partial-{os.getpid()}")
            partial.mkdir(parents=True, exist_ok=True)
            for f in manifest.files:
                data = store.get(layout.adapter_file(name, f.path)).data
                if hashlib.sha256(data).hexdigest() != f.sha256:
                    raise OrchError(
                        f"the shipped copy of LoRA adapter {name!r} does not match its manifest ({f.path})",
                        where=layout.adapter_file(name, f.path),
                        hint="the store was changed outside orch; delete the adapter's files and launch again",
                    )
                (partial / f.path).parent.mkdir(parents=True, exist_ok=True)
                (partial / f.path).write_bytes(data)
            (partial / ".complete").write_text("ok\n")
            if (target / ".complete").exists():  # another replica on this machine came first
                shutil.rmtree(partial)
            else:
                partial.rename(target)
        out[name] = str(target)
    return out


def _files(directory: Path) -> list[AdapterFile]:
    files = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        rel = path.relative_to(directory).as_posix()
        files.append(AdapterFile(path=rel, bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))
    return files
