"""The merges of account-wide views across gateways (api/http/cluster_views.py): a stream no gateway
answered for is listed as missing (when the subject filter takes it) and still counted; paging applies
to the merged list by name; usage and API counters are summed. Two real gateways answering are in
tests/test_cluster_views.py."""

from __future__ import annotations

from typing import Any

from api.http.cluster_views import merge_buckets, merge_info, merge_stream_lists


def _info(name: str, messages: int) -> dict[str, Any]:
    return {"config": {"name": name, "subjects": [f"{name.lower()}.>"]}, "state": {"messages": messages}}


CONFIGS = [("A", ["a.>"]), ("B", ["b.>"]), ("C", ["c.>"]), ("D", ["d.>"])]


def test_a_stream_nobody_answered_for_is_missing_and_pages_cover_the_merged_list() -> None:
    here = {"total": 2, "streams": [_info("A", 1), _info("C", 3)]}
    there = {"total": 1, "streams": [_info("B", 2)], "missing": ["X"]}  # X: its own gateway could not open it
    merged = merge_stream_lists([here, there], CONFIGS, None, 0, 256)
    assert [s["config"]["name"] for s in merged["streams"]] == ["A", "B", "C"]
    assert merged["total"] == 3 and merged["missing"] == ["D", "X"]
    page = merge_stream_lists([here, there], CONFIGS, None, 1, 1)
    assert [s["config"]["name"] for s in page["streams"]] == ["B"] and (page["offset"], page["limit"]) == (1, 1)
    filtered = merge_stream_lists([here, there], CONFIGS, "a.x", 0, 256)
    assert filtered["missing"] == ["X"]  # D does not take a.x: not missing from this view
    assert "missing" not in merge_stream_lists([here, {"streams": [_info("B", 2), _info("D", 0)]}], CONFIGS,
                                               None, 0, 256)


def test_usage_is_summed_and_streams_count_the_stored_configs() -> None:
    here = {"memory": 0, "storage": 100, "reserved_memory": 0, "reserved_storage": 10, "streams": 2, "consumers": 1,
            "limits": {"max_streams": -1}, "api": {"level": 1, "total": 5, "errors": 1}}
    there = dict(here, storage=50, streams=1, consumers=2, api={"level": 1, "total": 7, "errors": 0})
    merged = merge_info([here, there], 4)
    assert (merged["storage"], merged["reserved_storage"], merged["consumers"], merged["streams"]) == (150, 20, 3, 4)
    assert merged["api"] == {"level": 1, "total": 12, "errors": 1} and merged["limits"] == {"max_streams": -1}


def test_buckets_are_listed_once_by_name() -> None:
    merged = merge_buckets([{"buckets": [{"bucket": "b"}, {"bucket": "a"}]}, {"buckets": [{"bucket": "a"}]}])
    assert merged == {"total": 2, "buckets": [{"bucket": "a"}, {"bucket": "b"}]}
