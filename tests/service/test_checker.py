"""The API's request checkers (service/checker.py), real processes: identical bodies checked once,
a principal's concurrent checks capped (429 for it alone), a check over its time or memory limit a
422 naming the setting, and the checker replaced so that the next request is checked again."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from fxcc.service.checker import CheckerPool, CheckLimits, CheckRejected, ChecksBusy, TooCostly
from fxcc.service.handlers import http_status
from tests.service.conftest import unary_request


def wide_cat_body(nodes: int = 1400, width: int = 720) -> bytes:
    """About 27 MB: `nodes` nodes each cat([x] * width), costly to parse and to shape-check."""
    x = '{"kind":"node","name":"x"}'
    items = ",".join([x] * width)
    node = '{"name":"c%d","target":"aten.cat.default","args":[{"kind":"list","items":[' + items + ']}]}'
    spec = {"dtype": "float32", "sizes": [4, 8], "strides": [8, 1]}
    head = json.dumps({"name": "x", "spec": spec})
    return ('{"graph":{"placeholders":[' + head + '],"nodes":[' + ",".join(node % i for i in range(nodes))
            + f'],"outputs":[{{"kind":"node","name":"c{nodes - 1}"}}]}}}}').encode()


@pytest.fixture(scope="module")
def pool() -> Iterator[CheckerPool]:
    """Two checkers, a 3-s limit, one check at a time per principal."""
    p = CheckerPool(CheckLimits(processes=2, timeout_s=3.0, per_principal=1))
    p.start()
    yield p
    p.close()


def test_identical_bodies_are_checked_once_for_everyone(pool: CheckerPool) -> None:
    body = unary_request("aten.cos.default", sizes=(3, 5)).model_dump_json().encode()
    before = pool.checked
    keys: list[str] = []
    threads = [threading.Thread(target=lambda r=r: keys.append(pool.check(body, r).key))
               for r in (f"rank{i}" for i in range(8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert pool.checked == before + 1
    again = pool.check(body, "rank0")  # known by its digest now: queued as sent
    assert again.key == keys[0] and again.request_json is None and pool.checked == before + 1


def test_a_bad_body_is_the_checkers_422_and_a_good_one_gets_its_normalized_json(pool: CheckerPool) -> None:
    with pytest.raises(CheckRejected) as e:
        pool.check(unary_request("aten.no_such_op.default").model_dump_json().encode(), "alice")
    assert e.value.http_status == 422 and e.value.body["node"] == "y" and e.value.body["error"] == "InvalidGraph"
    good = pool.check(unary_request("aten.tan.default").model_dump_json(indent=2).encode(), "alice")
    assert json.loads(good.request_json or b"")["graph"]["nodes"][0]["target"] == "aten.tan.default"
    assert good.priority == "interactive" and len(good.key) == 64


def test_a_costly_body_is_stopped_and_holds_only_its_principals_slot(pool: CheckerPool) -> None:
    big = wide_cat_body()
    outcome: list[BaseException] = []

    def slow() -> None:
        try:
            pool.check(big, "alice")
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    t = threading.Thread(target=slow)
    t.start()
    deadline = time.monotonic() + 60
    while pool._per_principal.get("alice", 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ChecksBusy, match="FXCC_CHECK_PER_PRINCIPAL"):
        pool.check(unary_request("aten.exp.default").model_dump_json().encode(), "alice")
    assert pool.check(unary_request("aten.exp.default").model_dump_json().encode(), "bob").key
    t.join(120)
    assert len(outcome) == 1 and isinstance(outcome[0], TooCostly), outcome
    assert "FXCC_CHECK_TIMEOUT_S" in str(outcome[0]) and http_status(outcome[0]) == 422 and outcome[0].kind == "invalid"
    # The stopped checker was replaced: alice is checked again.
    assert pool.check(unary_request("aten.exp.default", sizes=(2, 2)).model_dump_json().encode(), "alice").key


def test_a_check_over_its_memory_limit_is_a_422_naming_the_setting() -> None:
    pool = CheckerPool(CheckLimits(processes=1, memory_mb=64))  # below what the interpreter itself takes
    try:
        with pytest.raises(TooCostly, match="FXCC_CHECK_MEMORY_MB"):
            pool.check(wide_cat_body(400, 400), "alice")  # seconds of parsing: the watch sees it
    finally:
        pool.close()
