"""This process's part of a team: in one process :class:`~comlrl.parallel.job.LocalTeam` has every member of the
torchrun team :class:`~comlrl.parallel.job.DistTeam`, its collectives identities and every agent and row its own; a
one-rank DistTeam answers as it does; and no code outside ``comlrl.parallel`` branches on whether the run is
distributed."""

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from comlrl.errors import ConfigError
from comlrl.parallel import distributed, job
from comlrl.parallel.job import DistTeam, LocalTeam, ProcessTeam
from comlrl.parallel.placement import resolve_placement

PACKAGE = Path(__file__).resolve().parents[2] / "comlrl"


@pytest.fixture
def one_rank_team():
    """A DistTeam of a one-process gloo group holding 3 agents, the group destroyed after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistTeam(resolve_placement(3, 1), torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def public_members(obj: object) -> set[str]:
    """The public names of an object: its class's methods and properties and its own attributes."""
    own = vars(obj) if not isinstance(obj, type) else {}
    return {n for n in [*dir(obj), *own] if not n.startswith("_")}


def interface(cls: type) -> set[str]:
    """The names :class:`ProcessTeam` declares: its attributes and its methods and properties."""
    return {n for n in [*cls.__annotations__, *vars(cls)] if not n.startswith("_")}


def agent_with_gradient(index: int = 1) -> SimpleNamespace:
    weight = torch.nn.Parameter(torch.zeros(2))
    weight.grad = torch.tensor([3.0, 4.0])
    return SimpleNamespace(index=index, params=[weight], model=torch.nn.Linear(1, 1), adapter=None, ref_model=None)


def test_the_local_team_has_every_public_member_of_the_distributed_team(one_rank_team):
    local = LocalTeam(torch.device("cpu"), 3)
    missing = public_members(one_rank_team) - public_members(local)
    assert not missing, f"LocalTeam lacks {sorted(missing)}"
    for name in public_members(DistTeam):
        theirs = inspect.getattr_static(DistTeam, name)
        if callable(theirs):  # the same parameters, so that a caller never asks which team it holds
            assert inspect.signature(getattr(DistTeam, name)) == inspect.signature(getattr(LocalTeam, name)), name
    declared = interface(ProcessTeam)
    assert {"is_main", "owns", "merge_metrics", "critic_shard", "save_checkpoint", "require_one_process"} <= declared
    for team in (local, one_rank_team):
        assert not declared - public_members(team), (
            f"{type(team).__name__} lacks {sorted(declared - public_members(team))}"
        )
        assert isinstance(team, ProcessTeam)
    assert not public_members(one_rank_team) - declared, "ProcessTeam names every member of DistTeam"


def test_the_local_team_holds_everything_and_its_collectives_are_identities():
    team = LocalTeam(torch.device("cpu"), 3)
    assert (team.rank, team.world_size, team.replica, team.is_main) == (0, 1, 0, True)
    assert team.local_agents == [0, 1, 2] and team.placement.ranks == ((0,), (0,), (0,))
    assert team.placement.replicas == 1 and team.device == torch.device("cpu")
    agent = agent_with_gradient()
    assert team.owns(agent) and team.owns_critic(None) and team.owns_critic(2)
    assert not team.sharded(agent) and team.critic_mesh(None) is None and team.critic_group(1) is None
    assert team.lockstep_passes(agent, 3) == 3 and team.lockstep_critic_passes(None, 2) == 2
    assert team.critic_shard(None) == team.critic_shard(1) == (0, 1, None, None)
    metrics = {"agent/0/loss": 1.5, "reward": 0.25}
    assert team.all_gather(metrics, "gather") == [metrics] and team.merge_metrics(metrics) == metrics
    batches, weights = [("samples", torch.tensor([1.0, -1.0]))], [torch.tensor([0.5, 0.5])]
    assert team.local_rows(batches, weights, 2) == (batches, weights)
    assert team.reduce_gradients(agent, {"loss": 2.0}) == {"loss": 2.0}
    assert team.sum_gradients(agent.params, {"loss": 2.0}, group=None, object_group=None, what="agent 1") == {
        "loss": 2.0
    }
    assert team.sum_metrics({"loss": 2.0}, None, "agent 1") == {"loss": 2.0}
    torch.testing.assert_close(agent.params[0].grad, torch.tensor([3.0, 4.0]))  # not scaled, not summed
    team.shard_agents([agent], bf16=True)
    team.shard_critic(agent.model, None, bf16=False)
    assert len(agent.params) == 1 and agent.params[0].grad is not None
    assert team.run_once(divmod, 7, 2) == (3, 1)
    with pytest.raises(ZeroDivisionError):
        team.run_once(divmod, 7, 0)
    assert team.sync("write checkpoint") is None
    error = ValueError("disk full")
    with pytest.raises(ValueError) as raised:
        team.sync("write checkpoint", error)
    assert raised.value is error
    team.require_one_process("only in one process")  # nothing to refuse
    assert team.team_forward


def test_generate_team_calls_the_loops_own_generation_with_every_row():
    calls = []

    def generate(agents, nodes, g, *, settings, autocast_dtype=None, seed=None, row_offset=0):
        calls.append((agents, nodes, g, settings, autocast_dtype, seed, row_offset))
        return ["samples of agent 0"]

    team = LocalTeam(torch.device("cpu"), 1)
    out = team.generate_team(
        ["agent"], ["node 0", "node 1"], 2, settings="settings", autocast_dtype=None, seed=7, generate_team=generate
    )
    assert out == ["samples of agent 0"]
    assert calls == [(["agent"], ["node 0", "node 1"], 2, "settings", None, 7, 0)]


def test_a_one_rank_distributed_team_answers_as_the_local_team(one_rank_team):
    local = LocalTeam(torch.device("cpu"), 3)
    metrics = {"agent/1/loss": 0.5}
    batches, weights = [("samples", torch.tensor([1.0]))], [torch.tensor([1.0])]
    for team in (local, one_rank_team):
        agent = agent_with_gradient()
        assert team.is_main and team.local_agents == [0, 1, 2] and team.placement == local.placement
        assert team.owns(agent) and team.owns_critic(None) and team.owns_critic(0) and not team.sharded(agent)
        assert team.lockstep_passes(agent, 4) == 4 and team.lockstep_critic_passes(1, 4) == 4
        assert team.critic_shard(None)[:2] == team.critic_shard(2)[:2] == (0, 1)
        assert team.all_gather(metrics, "gather") == [metrics] and team.merge_metrics(metrics) == metrics
        assert team.local_rows(batches, weights, 1) == (batches, weights)
        assert team.reduce_gradients(agent, {"loss": 1.0}) == {"loss": 1.0}
        torch.testing.assert_close(agent.params[0].grad, torch.tensor([3.0, 4.0]))
        assert team.run_once(divmod, 9, 4) == (2, 1)
        team.sync("a barrier")
    # what differs by design: torchrun refuses what runs in one process only, and counts passes agent by agent
    with pytest.raises(ConfigError, match="only in one process"):
        one_rank_team.require_one_process("only in one process")
    assert local.team_forward and not one_rank_team.team_forward


def test_setup_outside_torchrun_is_a_local_team_of_every_agent(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = SimpleNamespace(device="cpu", fsdp="full_shard", fsdp_config=None, placement=None, agent_devices=None)
    team = job.setup(args, 2)
    assert isinstance(team, LocalTeam) and team.local_agents == [0, 1] and team.device == torch.device("cpu")
    assert team.plan is None  # one process holds each whole agent: nothing is sharded


def test_setup_under_torchrun_refuses_agent_devices_before_the_process_group(monkeypatch):
    monkeypatch.setattr(distributed, "launched", lambda: True)
    monkeypatch.setattr(distributed, "init", lambda *a, **k: pytest.fail("the process group was started"))
    args = SimpleNamespace(device="cpu", fsdp=None, fsdp_config=None, placement=None, agent_devices=["cpu", "cpu"])
    with pytest.raises(ConfigError, match=r"agent_devices=\['cpu', 'cpu'\].*placement"):
        job.setup(args, 2)


# a branch on whether the run is distributed: a test of the team against None, or of the team's truth
BRANCHES = re.compile(
    r"\bdist is (not )?None"
    r"|\bif (not )?([\w.]+\.)?dist\s*(:|\band\b|\bor\b)"
    r"|\b(and|or) (not )?([\w.]+\.)?dist\s*(:|$|\)|\band\b|\bor\b)"
    r"|\bdist else\b"
    r"|getattr\([\w.]+, \"dist\""
    r"|os\.environ\.get\(\"WORLD_SIZE\""
)


def test_no_code_outside_the_parallel_package_branches_on_distribution():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "parallel" not in path.relative_to(PACKAGE).parts[:1]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if BRANCHES.search(line.split("#")[0])
    ]
    assert not found, "branches on whether the run is distributed:\n" + "\n".join(found)


def test_the_branch_pattern_catches_each_form():
    caught = [
        "if self.dist is not None:",
        "x = a if self.dist else b",
        "if dist is None and plan:",
        "elif trainer.dist is not None:",
        "if coef is not None and self.dist:",
        'if getattr(trainer, "dist", None) is None or trainer.dist.is_main:',
        'if int(os.environ.get("WORLD_SIZE", "1")) > 1:',
    ]
    assert all(BRANCHES.search(line) for line in caught)
    kept = ["if not self.dist.is_main:", "self.dist.merge_metrics(m)", "team = self.dist", "if self.distance:"]
    assert not any(BRANCHES.search(line) for line in kept)
