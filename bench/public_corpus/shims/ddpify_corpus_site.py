"""Patches every process of a public-corpus run gets at start-up (imported by sitecustomize).

- DDPIFY_CORPUS_MAX_STEPS=N: the process leaves with exit 0 after its N-th optimizer step (all ranks
  take the same steps, so all leave together). Only for scripts whose length no argument bounds and
  whose data the shim cannot shrink enough; the runner's table marks such entries.
- requests.get / urllib.request.urlretrieve / urlopen of a known data set address answer with made-up
  data of the same format instead of the network (today: the Cora citation graph, as a .tgz).
"""

from __future__ import annotations

import io
import os
import sys
import tarfile


def _cap_steps() -> None:
    limit = int(os.environ.get("DDPIFY_CORPUS_MAX_STEPS", "0") or 0)
    if limit <= 0:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    taken = [0]

    def after_step(optimizer, args, kwargs):
        taken[0] += 1
        if taken[0] >= limit:
            print(f"[ddpify corpus] stopping after {limit} optimizer steps (DDPIFY_CORPUS_MAX_STEPS)", file=sys.stderr, flush=True)
            sys.stdout.flush()
            _end_worker_processes()
            os._exit(0)

    register_optimizer_step_post_hook(after_step)


def _end_worker_processes() -> None:
    """Kill the process's multiprocessing children (environment workers, loader workers) before it leaves:
    os._exit skips their shutdown, and an orphan holding the run's stdout would keep the runner waiting."""
    if "multiprocessing" not in sys.modules:
        return
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


def fake_cora(nodes: int = 1800, features: int = 64, classes: int = 7, edges: int = 5000) -> bytes:
    """A made-up Cora in the original layout: cora/cora.content (id, 0/1 features, label) and cora/cora.cites."""
    import random

    rng = random.Random(0)
    ids = rng.sample(range(10_000, 10_000_000), nodes)
    labels = [f"Class_{i}" for i in range(classes)]
    content = "".join(f"{i}\t" + "\t".join(str(int(rng.random() < 0.1)) for _ in range(features)) + f"\t{rng.choice(labels)}\n" for i in ids)
    cites = "".join(f"{rng.choice(ids)}\t{rng.choice(ids)}\n" for _ in range(edges))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in (("cora/cora.content", content), ("cora/cora.cites", cites), ("cora/README", "made-up Cora\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


FAKES = {"cora.tgz": fake_cora}


def _fake_for(url: str):
    for tail, make in FAKES.items():
        if str(url).endswith(tail):
            return make
    return None


class _Response:
    def __init__(self, data: bytes):
        self.raw, self.content, self.status_code, self.ok = io.BytesIO(data), data, 200, True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def raise_for_status(self):
        pass

    def iter_content(self, chunk_size=1 << 16):
        for i in range(0, len(self.content), chunk_size):
            yield self.content[i:i + chunk_size]


class _Finder:
    """Patches `requests` as it is imported (importing it here would slow every process down)."""

    def find_spec(self, name, path, target=None):
        if name != "requests":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)

            def get(url, *args, **kwargs):
                make = _fake_for(url)
                if make is None:
                    raise OSError(f"ddpify corpus: no network here, and no made-up data for {url}")
                return _Response(make())

            module.get = get

        spec.loader.exec_module = exec_module
        return spec


def _patch_urllib() -> None:
    import urllib.request

    real_urlretrieve = urllib.request.urlretrieve

    def urlretrieve(url, filename=None, *args, **kwargs):
        make = _fake_for(url)
        if make is None:
            raise OSError(f"ddpify corpus: no network here, and no made-up data for {url}")
        with open(filename, "wb") as f:
            f.write(make())
        return filename, None

    urllib.request.urlretrieve = urlretrieve


_cap_steps()
_patch_urllib()
if "requests" not in sys.modules:
    sys.meta_path.insert(0, _Finder())
