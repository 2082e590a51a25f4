"""An RL training loop with in-flight weight updates (`make rl-demo`).

A tiny Llama policy learns to answer in digits: a completion's reward is the
share of its tokens that are digits, checked from the token ids (a verifiable
reward, no reward model). Two sides share the work:

- the actors: background threads keep every SGLang server busy with rollouts,
  a few concurrent streaming `/generate` requests per server, each one prompt
  sampled `group_size` times at temperature 1 (`input_ids` in, `output_ids`
  out). Every completion records the `weight_version` the server reported
  with its first token: the policy version that generated it;
- the trainer: plain PyTorch on the same architecture, loaded with
  `transformers` from the same checkpoint. Each step takes the newest
  rollouts, scores them, computes group-normalised advantages (GRPO-style)
  and the log-probs of the sampled tokens, takes one Adam step and pushes the
  new weights into every server with one `WeightSender` (an atomic two-phase
  sync: all servers apply or none does) while the actors keep generating.

A sample's staleness is the trainer's version when it learns from the sample
minus the sample's version (0: on-policy). `--no-sync` is the control: the
same loop without the syncs, whose reward must stay flat.

    python -m examples.rl_loop                    # TP 1 + TP 2, control first
    python -m examples.rl_loop --tps 1 --steps 8 --skip-control
    python -m examples.rl_loop --no-sync          # the control alone

The servers are started here on the CPU (harness.cpu_sglang); with your own
servers, call `run_loop` with their `Engine`s: they must serve the checkpoint
the trainer loads and start with `--weight-version 0`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import torch

from rlsync import client
from rlsync.sender import Engine, WeightSender

ROOT = Path(__file__).resolve().parents[1]
DIGITS = "0123456789"
PROMPT_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# The checkpoint's dtype: what the servers hold and what a sync sends.
SERVED_DTYPE = torch.bfloat16
# The flag every server needs: the checkpoint is weight version 0.
INITIAL_VERSION_ARGS = ["--weight-version", "0"]
# Adam's learning rate by harness model size: the reward rises within ~12 steps.
LEARNING_RATES = {"test": 3e-2, "demo": 3e-4}


@dataclass(frozen=True)
class LoopConfig:
    steps: int = 20
    seed: int = 0
    # False: the control run; the servers keep the checkpoint's weights.
    sync: bool = True
    lr: float = LEARNING_RATES["demo"]
    group_size: int = 8  # completions per prompt: one GRPO group
    groups_per_step: int = 4
    completion_tokens: int = 16
    prompt_chars: int = 8
    num_prompts: int = 16
    actors_per_server: int = 2  # concurrent /generate requests per server
    bucket_mb: int = 16
    # In-flight requests finish on the old weights, then the servers apply and
    # drop their prefix caches: each sample comes from exactly one version.
    flush_cache: bool = True
    step_timeout: float = 300.0  # seconds a step waits for its rollouts


# --- the task ----------------------------------------------------------------


class DigitTask:
    """Random lowercase prompts; reward = the share of digit tokens."""

    def __init__(self, tokenizer: Any, config: LoopConfig) -> None:
        rng = random.Random(config.seed)
        self.prompts = [
            [tokenizer.bos_token_id]
            + tokenizer.encode(
                "".join(rng.choices(PROMPT_LETTERS, k=config.prompt_chars)),
                add_special_tokens=False,
            )
            for _ in range(config.num_prompts)
        ]
        self.digit_ids = frozenset(tokenizer.convert_tokens_to_ids(list(DIGITS)))

    def reward(self, output_ids: list[int]) -> float:
        return sum(t in self.digit_ids for t in output_ids) / len(output_ids)


# --- the actors: rollouts on the servers, in background threads ---------------


@dataclass
class Group:
    """One prompt's completions from one server."""

    prompt_ids: list[int]
    completions: list[list[int]]
    versions: list[int]  # the weight version of each completion's first token


@dataclass
class ActorLog:
    """What the actors saw. Their threads append to the lists (atomic in
    CPython); the counter takes the lock."""

    token_times: list[float] = field(default_factory=list)
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tokens_between(self, t0: float, t1: float) -> int:
        return sum(t0 <= t <= t1 for t in list(self.token_times))

    def count_request(self) -> None:
        with self.lock:
            self.requests += 1


class RolloutBuffer:
    """Finished groups; the trainer takes the newest and drops the rest, so
    the actors never wait for the trainer."""

    def __init__(self) -> None:
        self._groups: list[Group] = []
        self._ready = threading.Condition()
        self.dropped = 0

    def put(self, group: Group) -> None:
        with self._ready:
            self._groups.append(group)
            self._ready.notify_all()

    def take_newest(self, n: int, timeout: float, log: ActorLog) -> list[Group]:
        deadline = time.monotonic() + timeout
        with self._ready:
            while len(self._groups) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(self._groups)}/{n} rollout groups after {timeout:.0f} s; "
                        f"failed requests: {log.failures[-3:]}"
                    )
                self._ready.wait(left)
            taken, older = self._groups[-n:], self._groups[:-n]
            self._groups = []
            self.dropped += len(older)
            return taken


class RolloutFailed(RuntimeError):
    pass


def generate_group(
    http: httpx.Client,
    url: str,
    prompt_ids: list[int],
    config: LoopConfig,
    log: ActorLog,
) -> Group:
    """`group_size` completions of one prompt in one streaming request."""
    body = {
        "input_ids": [prompt_ids] * config.group_size,
        "sampling_params": {
            "temperature": 1.0,
            "max_new_tokens": config.completion_tokens,
            "ignore_eos": True,
        },
        "stream": True,
    }
    completions: list[list[int]] = [[] for _ in range(config.group_size)]
    versions: list[Optional[int]] = [None] * config.group_size
    with http.stream("POST", url + "/generate", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RolloutFailed(f"{url}: {chunk['error']}")
            i = chunk.get("index", 0)
            arrived = time.monotonic()
            # output_ids are cumulative: the tokens so far
            new_tokens = len(chunk["output_ids"]) - len(completions[i])
            log.token_times.extend([arrived] * new_tokens)
            completions[i] = chunk["output_ids"]
            if versions[i] is None:
                versions[i] = int(chunk["meta_info"]["weight_version"])
    lengths = [len(c) for c in completions]
    if lengths != [config.completion_tokens] * config.group_size:
        raise RolloutFailed(f"{url}: completions of {lengths} tokens")
    return Group(prompt_ids, completions, [int(v) for v in versions if v is not None])


def actor(
    url: str,
    task: DigitTask,
    config: LoopConfig,
    seed: int,
    buffer: RolloutBuffer,
    log: ActorLog,
    stop: threading.Event,
) -> None:
    """Rollouts on one server, one request after another, until `stop`."""
    rng = random.Random(seed)
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            prompt = rng.choice(task.prompts)
            log.count_request()
            try:
                buffer.put(generate_group(http, url, prompt, config, log))
            except Exception as e:
                log.failures.append(f"{url}: {type(e).__name__}: {e}")
                stop.wait(1.0)  # back off before the next request


def start_actors(
    engines: list[Engine],
    task: DigitTask,
    config: LoopConfig,
    buffer: RolloutBuffer,
    log: ActorLog,
    stop: threading.Event,
) -> list[threading.Thread]:
    threads = []
    for e, engine in enumerate(engines):
        for a in range(config.actors_per_server):
            seed = config.seed * 1000 + e * config.actors_per_server + a
            args = (engine.url, task, config, seed, buffer, log, stop)
            threads.append(threading.Thread(target=actor, args=args, daemon=True))
    for t in threads:
        t.start()
    return threads


# --- the trainer: plain PyTorch ----------------------------------------------


def completion_logprobs(model: torch.nn.Module, groups: list[Group]) -> torch.Tensor:
    """log pi(token) of every sampled completion token: [samples, tokens]."""
    rows = [g.prompt_ids + c for g in groups for c in g.completions]
    ids = torch.tensor(rows)
    prompt_len = len(groups[0].prompt_ids)
    logits = model(input_ids=ids).logits[:, prompt_len - 1 : -1].float()
    targets = ids[:, prompt_len:].unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1)


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """[groups, group_size] rewards, normalised within each group."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + 1e-6)


def policy_gradient_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    groups: list[Group],
    rewards: torch.Tensor,
) -> float:
    """One REINFORCE step with group-normalised advantages; the loss."""
    advantages = group_advantages(rewards).flatten()
    logprobs = completion_logprobs(model, groups)
    loss = -(advantages[:, None] * logprobs).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def served_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainer's parameters as the servers hold them (checkpoint names)."""
    return {name: p.detach().to(SERVED_DTYPE) for name, p in model.named_parameters()}


def load_policy(model_dir: Path) -> tuple[Any, torch.nn.Module]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return tokenizer, model


# --- the loop ----------------------------------------------------------------


@dataclass
class StepRecord:
    step: int
    reward: float
    loss: float
    versions: list[int]  # each sample's weight version
    staleness: list[int]  # each sample's staleness
    sync_seconds: Optional[float]
    sync_bytes: Optional[int]
    tokens_during_sync: int
    seconds: float  # the step's wall time, rollout wait included


@dataclass
class LoopResult:
    config: LoopConfig
    engines: list[Engine]
    steps: list[StepRecord]
    published: list[int]  # the versions the trainer published (0: the checkpoint)
    requests: int
    failures: list[str]
    tokens: int
    rollouts_unused: int
    seconds: float

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.steps]

    @property
    def unpublished_versions(self) -> set[int]:
        seen = {v for s in self.steps for v in s.versions}
        return seen - set(self.published)


def check_initial_versions(engines: list[Engine]) -> None:
    for engine in engines:
        served = client.get_weight_version(engine.url, api_key=engine.api_key)
        if served != "0":
            raise RuntimeError(
                f"{engine.url} serves weight version {served!r}: start it from the "
                f"trainer's checkpoint with {' '.join(INITIAL_VERSION_ARGS)}"
            )


def connect_sender(engines: list[Engine], config: LoopConfig) -> WeightSender:
    from harness.cpu_sglang import free_port

    sender = WeightSender(
        engines,
        master_port=free_port(),
        group_name="rl-loop",
        backend="gloo",  # "nccl" on GPUs
        bucket_bytes=config.bucket_mb << 20,
    )
    sender.connect()
    return sender


def run_loop(
    engines: list[Engine],
    model_dir: Path,
    config: LoopConfig,
    on_step: Optional[Callable[[StepRecord], None]] = None,
) -> LoopResult:
    """Train for `config.steps` steps on rollouts from `engines`, each serving
    `model_dir` from weight version 0; syncing after every step unless
    `config.sync` is False."""
    torch.manual_seed(config.seed)
    tokenizer, model = load_policy(model_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    task = DigitTask(tokenizer, config)
    check_initial_versions(engines)
    sender = connect_sender(engines, config) if config.sync else None
    buffer, log, stop = RolloutBuffer(), ActorLog(), threading.Event()
    threads = start_actors(engines, task, config, buffer, log, stop)
    published, records = [0], []
    t_start = time.monotonic()
    try:
        for step in range(1, config.steps + 1):
            record = train_step(
                step, model, optimizer, task, buffer, log, sender, config
            )
            if sender is not None:
                published.append(step)
            records.append(record)
            if on_step is not None:
                on_step(record)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=130)
        if sender is not None:
            sender.close()
    return LoopResult(
        config=config,
        engines=engines,
        steps=records,
        published=published,
        requests=log.requests,
        failures=list(log.failures),
        tokens=len(log.token_times),
        rollouts_unused=buffer.dropped,
        seconds=time.monotonic() - t_start,
    )


def train_step(
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    task: DigitTask,
    buffer: RolloutBuffer,
    log: ActorLog,
    sender: Optional[WeightSender],
    config: LoopConfig,
) -> StepRecord:
    """Learn from the newest rollouts, then publish the weights as `step`."""
    t0 = time.monotonic()
    groups = buffer.take_newest(config.groups_per_step, config.step_timeout, log)
    rewards = torch.tensor([[task.reward(c) for c in g.completions] for g in groups])
    loss = policy_gradient_step(model, optimizer, groups, rewards)
    versions = [v for g in groups for v in g.versions]
    trainer_version = step - 1  # the weights these samples are learnt with
    sync_seconds, sync_bytes, tokens = None, None, 0
    if sender is not None:
        sync_start = time.monotonic()
        result = sender.sync(
            served_weights(model),
            weight_version=str(step),
            atomic=True,
            flush_cache=config.flush_cache,
        )
        sync_end = time.monotonic()
        if not result.success:
            raise RuntimeError(f"step {step}: not applied everywhere: {result.engines}")
        sync_seconds, sync_bytes = sync_end - sync_start, result.bytes
        tokens = log.tokens_between(sync_start, sync_end)
    return StepRecord(
        step=step,
        reward=rewards.mean().item(),
        loss=loss,
        versions=versions,
        staleness=[trainer_version - v for v in versions],
        sync_seconds=sync_seconds,
        sync_bytes=sync_bytes,
        tokens_during_sync=tokens,
        seconds=time.monotonic() - t0,
    )


# --- the demo: servers on this machine ---------------------------------------


def start_servers(model_dir: Path, tps: list[int]) -> list[Any]:
    """A patched SGLang server per TP size, on the CPU, in parallel."""
    from harness.cpu_sglang import BUILD, launch

    logs = BUILD / "logs"
    with cf.ThreadPoolExecutor(len(tps)) as pool:
        futures = [
            pool.submit(
                launch,
                model_dir,
                logs / f"rl-loop-tp{tp}-{i}.log",
                tp=tp,
                extra_args=INITIAL_VERSION_ARGS,
            )
            for i, tp in enumerate(tps)
        ]
    servers = [f.result() for f in futures if f.exception() is None]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for s in servers:
            s.stop()
        raise errors[0]
    return servers


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    today = datetime.date.today().isoformat()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tps", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--size", choices=("test", "demo"), default="demo", help="harness model size"
    )
    parser.add_argument("--lr", type=float, default=None, help="default: by size")
    parser.add_argument("--no-sync", action="store_true", help="the control alone")
    parser.add_argument(
        "--skip-control", action="store_true", help="no control run before"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=ROOT / "bench" / "results" / f"rl-loop-{today}.json",
    )
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "rl-loop.png")
    parser.add_argument("--no-plot", action="store_true")
    return parser.parse_args(argv)


def run_and_print(
    engines: list[Engine], model_dir: Path, config: LoopConfig
) -> LoopResult:
    from examples.rl_report import TABLE_HEADER, table_row

    title = "synced after every step" if config.sync else "control: no sync"
    print(f"\n{title}\n{TABLE_HEADER}", flush=True)
    result = run_loop(
        engines, model_dir, config, on_step=lambda r: print(table_row(r), flush=True)
    )
    during_syncs = sum(r.tokens_during_sync for r in result.steps)
    print(
        f"reward {result.rewards[0]:.3f} -> {result.rewards[-1]:.3f}; "
        f"{result.requests} requests, {len(result.failures)} lost, "
        f"{result.tokens} tokens ({during_syncs} during syncs), "
        f"{result.seconds:.0f} s",
        flush=True,
    )
    return result


def main(argv: Optional[list[str]] = None) -> int:
    from examples.rl_report import plot, results_json
    from harness.cpu_sglang import BUILD
    from harness.tiny_model import make_tiny_model

    args = parse_args(argv)
    torch.set_num_threads(1)  # the servers need the cores more than we do
    config = LoopConfig(
        steps=args.steps, seed=args.seed, lr=args.lr or LEARNING_RATES[args.size]
    )
    model_dir = make_tiny_model(BUILD / "models", args.size)
    t0 = time.monotonic()
    servers = start_servers(model_dir, args.tps)
    engines = [Engine(s.url, tp_size=s.tp) for s in servers]
    print(
        f"model {model_dir.name}; servers "
        + ", ".join(f"{e.url} (TP {e.tp_size})" for e in engines)
        + f" up in {time.monotonic() - t0:.0f} s"
    )
    trained = control = None
    try:
        if args.no_sync or not args.skip_control:
            # First: the control leaves the servers' weights as they are.
            control = run_and_print(
                engines, model_dir, dataclasses.replace(config, sync=False)
            )
        if not args.no_sync:
            trained = run_and_print(engines, model_dir, config)
    finally:
        for s in servers:
            s.stop()
    out = results_json(trained, control, model_dir)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nresults: {args.json}")
    if not args.no_plot:
        plot(trained, control, args.plot)
        print(f"plot: {args.plot}")
    problems = [
        f"{name} run: {problem}"
        for name, run in (("synced", trained), ("control", control))
        if run is not None
        for problem in run_problems(run)
    ]
    for p in problems:
        print(f"FAILED: {p}")
    return 1 if problems else 0


def run_problems(result: LoopResult) -> list[str]:
    """What must hold in any run: no lost request, only published versions."""
    problems = [f"lost request: {f}" for f in result.failures]
    if result.unpublished_versions:
        problems.append(f"unpublished versions {sorted(result.unpublished_versions)}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
