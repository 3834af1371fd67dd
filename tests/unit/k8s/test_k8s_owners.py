"""Owner resolution: ReplicaSet -> Deployment, Job -> CronJob, cached, failures retried."""

from __future__ import annotations

from producers.k8s.objects import OwnerReference
from producers.k8s.owners import LookupFailed, OwnerResolver, controller_of
from schemas import Owner


def ref(kind: str, name: str, controller: bool | None = True) -> OwnerReference:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": f"uid-{name}",
        "controller": controller,
    }


class Lookups:
    """A lookup that answers from a table and counts its calls."""

    def __init__(
        self, table: dict[tuple[str, str, str], OwnerReference | Exception | None]
    ) -> None:
        self.table = table
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, kind: str, namespace: str, name: str) -> OwnerReference | None:
        self.calls.append((kind, namespace, name))
        answer = self.table.get((kind, namespace, name))
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_replicaset_resolves_to_its_deployment_once() -> None:
    lookups = Lookups({("ReplicaSet", "ml", "web-7d9c"): ref("Deployment", "web")})
    resolver = OwnerResolver(lookups)
    for _ in range(3):
        assert resolver.resolve("ml", [ref("ReplicaSet", "web-7d9c")]) == Owner(
            kind="Deployment", name="web"
        )
    assert lookups.calls == [("ReplicaSet", "ml", "web-7d9c")]
    assert resolver.stats.lookups == 1


def test_a_job_resolves_to_its_cronjob_and_a_bare_job_stays_a_job() -> None:
    lookups = Lookups(
        {
            ("Job", "research", "nightly-28990080"): ref("CronJob", "nightly"),
            ("Job", "research", "adhoc"): None,
        }
    )
    resolver = OwnerResolver(lookups)
    assert resolver.resolve("research", [ref("Job", "nightly-28990080")]) == Owner(
        kind="CronJob", name="nightly"
    )
    assert resolver.resolve("research", [ref("Job", "adhoc")]) == Owner(kind="Job", name="adhoc")
    assert resolver.resolve("research", [ref("Job", "adhoc")]) == Owner(kind="Job", name="adhoc")
    assert len(lookups.calls) == 2  # "no owner" is cached too


def test_other_kinds_are_not_looked_up() -> None:
    lookups = Lookups({})
    resolver = OwnerResolver(lookups)
    assert resolver.resolve("ml", [ref("StatefulSet", "db")]) == Owner(
        kind="StatefulSet", name="db"
    )
    assert resolver.resolve("ml", [ref("PyTorchJob", "bert")]) == Owner(
        kind="PyTorchJob", name="bert"
    )
    assert resolver.resolve("ml", None) is None
    assert resolver.resolve("ml", []) is None
    assert lookups.calls == []


def test_a_failed_lookup_falls_back_and_is_asked_again() -> None:
    lookups = Lookups({("ReplicaSet", "ml", "web-7d9c"): LookupFailed("503")})
    resolver = OwnerResolver(lookups)
    assert resolver.resolve("ml", [ref("ReplicaSet", "web-7d9c")]) == Owner(
        kind="ReplicaSet", name="web-7d9c"
    )
    lookups.table[("ReplicaSet", "ml", "web-7d9c")] = ref("Deployment", "web")
    assert resolver.resolve("ml", [ref("ReplicaSet", "web-7d9c")]) == Owner(
        kind="Deployment", name="web"
    )
    assert resolver.stats.failures == 1
    assert len(lookups.calls) == 2


def test_without_a_lookup_the_direct_controller_is_the_owner() -> None:
    assert OwnerResolver(None).resolve("ml", [ref("ReplicaSet", "web-7d9c")]) == Owner(
        kind="ReplicaSet", name="web-7d9c"
    )


def test_the_controller_reference_wins_over_others() -> None:
    refs = [ref("ConfigMap", "x", controller=None), ref("Job", "train", controller=True)]
    assert controller_of(refs) == refs[1]
    assert controller_of([ref("ConfigMap", "x", controller=False)]) == ref(
        "ConfigMap", "x", controller=False
    )
    assert controller_of([{"kind": "Job"}]) is None  # no name: unusable


def test_the_cache_is_bounded() -> None:
    lookups = Lookups({})
    resolver = OwnerResolver(lookups, cache_size=2)
    for name in ("a", "b", "c", "a"):
        resolver.resolve("ml", [ref("ReplicaSet", name)])
    assert [call[2] for call in lookups.calls] == ["a", "b", "c", "a"]  # a was evicted
