"""What `orch serve` runs with, resolved once at start: the spec, the store, the served models, keys, hosts, limits."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends import backend_for
from orchestrator.core.context import RunContext
from orchestrator.core.errors import SpecError
from orchestrator.core.layout import RunLayout
from orchestrator.core.spec import ModelSpec, RunSpec
from orchestrator.core.store import Store, open_store
from orchestrator.planning.deadline import parse_duration
from orchestrator.serve.auth import Keys, check_exposure, load_owners
from orchestrator.serve.uploads import UploadLimits
from orchestrator.web.hosts import AllowedHosts, is_loopback

#: Where the names the server answers to come from, for errors about them.
ALLOWED_HOSTS_FLAG = "--allowed-host / ORCH_SERVE_ALLOWED_HOSTS"
#: Addresses that listen on every interface: they name no host a client would use.
EVERY_INTERFACE = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class ServeSettings:
    #: The server's spec: every batch's run starts from it (backend, workers, sampling defaults...).
    spec: RunSpec
    store: Store
    #: Served name -> the model a batch naming it runs.
    models: dict[str, ModelSpec]
    keys: Keys
    #: The completion_window values accepted -> seconds.
    windows: dict[str, float]
    #: The names a request's Host header may give (loopback ones, --host, --allowed-host).
    allowed_hosts: AllowedHosts

    @property
    def runners(self) -> dict[str, str]:
        """Served name -> its runner: generate (chat, completions) or pooling (embeddings, score, rerank)."""
        return {name: model.runner for name, model in self.models.items()}

    @property
    def poll_interval(self) -> float:
        return self.spec.serve.poll_interval

    @property
    def upload_limits(self) -> UploadLimits:
        serve = self.spec.serve
        return UploadLimits(serve.max_upload_bytes, serve.upload_idle_timeout, serve.upload_timeout)


def load_settings(
    spec: RunSpec,
    model_flags: Sequence[str],
    *,
    host: str,
    api_keys: str | None,
    api_keys_file: str | None,
    allowed_hosts: Sequence[str] = (),
    aliases: Sequence[str] = (),
) -> ServeSettings:
    """1. The served models: `serve.models`, then `--model NAME=PATH` (a flag wins over the spec),
       then `--model-alias ALIAS=NAME`.
    2. The completion windows, each a duration.
    3. The keys (hashed here; the keys themselves go no further), and no open server off loopback.
    4. The host names requests may give: loopback ones, the address listened on, and `allowed_hosts`.
    5. The store, and the backend checked against it now rather than at the first batch.
    """
    models = with_aliases(served_models(spec, model_flags), aliases)
    windows = {w: parse_duration(w, where="serve.completion_windows") for w in spec.serve.completion_windows}
    owners = load_owners(api_keys, api_keys_file)
    check_exposure(host, owners)
    named = [host] if host not in EVERY_INTERFACE and not is_loopback(host) else []
    hosts = AllowedHosts.parse([*named, *allowed_hosts], where=ALLOWED_HOSTS_FLAG)
    store = open_store(spec.store)
    probe = RunLayout("orch-serve")
    backend_for(RunContext(spec.model_copy(update={"run": probe.run}), store, probe))
    return ServeSettings(spec=spec, store=store, models=models, keys=Keys(owners), windows=windows, allowed_hosts=hosts)


def served_models(spec: RunSpec, model_flags: Sequence[str]) -> dict[str, ModelSpec]:
    """Each served model is the spec's `model` section with its own fields on top."""
    entries = {name: entry.model_dump(exclude_unset=True) for name, entry in spec.serve.models.items()}
    for flag in model_flags:
        name, sep, target = flag.partition("=")
        if not sep or not name.strip() or not target.strip():
            raise SpecError(f"--model {flag!r} is not NAME=PATH_OR_HUB_ID", hint="e.g. --model tiny=.cache/models/tiny")
        entries[name.strip()] = {"name": target.strip()}
    if not entries:
        raise SpecError(
            "orch serve serves no model",
            hint="--model NAME=PATH_OR_HUB_ID (repeatable), or a serve.models section in the spec",
            where="serve.models",
        )
    base = spec.model.model_dump()
    models = {}
    for name, fields in entries.items():
        model = ModelSpec.model_validate({**base, **fields})
        if not model.name:
            raise SpecError(f"served model {name!r} names no path or hub id", where=f"serve.models.{name}.name")
        # A local directory is found from wherever the workers start.
        local = Path(model.name)
        if local.exists():
            model.name = str(local.resolve())
        models[name] = model
    return models


def with_aliases(models: dict[str, ModelSpec], alias_flags: Sequence[str]) -> dict[str, ModelSpec]:
    """`--model-alias gpt-4o-mini=smol`: the alias is served as the model it names, so OpenAI code
    that names `gpt-4o-mini` runs unchanged; its batches are answered under the alias it asked for."""
    out = dict(models)
    for flag in alias_flags:
        alias, sep, name = (part.strip() for part in flag.partition("="))
        if not sep or not alias or not name:
            raise SpecError(
                f"--model-alias {flag!r} is not ALIAS=SERVED_NAME", hint="e.g. --model-alias gpt-4o-mini=smol"
            )
        if name not in models:
            close = difflib.get_close_matches(name, list(models), n=1)
            raise SpecError(
                f"--model-alias {flag!r}: no served model {name!r} (served: {', '.join(sorted(models))})",
                hint=f"did you mean {alias}={close[0]}?" if close else "name one of the served models after the =",
            )
        if alias in out:
            raise SpecError(f"--model-alias {flag!r}: {alias!r} is already a served name", hint="choose another alias")
        out[alias] = models[name].model_copy(deep=True)
    return out
