"""bench/results is a record: every folder complete, every summary regenerated, every link live."""

import json
import re
from pathlib import Path

import pytest

from bench import summarize

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir())


def test_results_stay_small():
    """One folder per published set of claims, raw files only: tens of files, not hundreds."""
    assert len([p for p in RESULTS.rglob("*") if p.is_file()]) < 100


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_folder_is_manifest_raw_files_and_its_generated_summary(folder):
    listed = {f for run in json.loads((folder / "manifest.json").read_text())["runs"]
              for f in run["files"]}
    present = {p.name for p in folder.iterdir()}
    assert present == listed | {"manifest.json", "summary.md"}, present ^ (listed | {
        "manifest.json", "summary.md"})
    assert (folder / "summary.md").read_text() == summarize.summary(folder)


def test_a_manifest_without_commit_is_rejected(tmp_path):
    (tmp_path / "a.json").write_text("[]")
    manifest = {"title": "t", "claims": "c", "gpu": "g", "driver": "d", "jax": "j",
                "runs": [{"files": ["a.json"], "command": "x"}]}
    with pytest.raises(ValueError, match=r"runs\[0\]\.commit"):
        summarize.check_manifest(manifest, tmp_path)
    manifest["runs"][0].update(commit="abc", files=["a.json", "gone.json"])
    with pytest.raises(ValueError, match="gone.json"):
        summarize.check_manifest(manifest, tmp_path)


def test_records_table_lists_each_config_once():
    lines = summarize.records_table([{"name": "a", "us": 1.23456, "config": "C(x=1)"},
                                     {"name": "b", "us": None, "config": "C(x=1)"}])
    assert lines[:4] == ["| name | us | config |", "|---|---|---|", "| a | 1.235 | [1] |",
                         "| b | - | [1] |"]
    assert lines[5:] == ["[1] `C(x=1)`  "]


def test_index_links_resolve():
    text = (RESULTS / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    assert targets
    missing = [t for t in targets if not (RESULTS / t).exists()]
    assert not missing, missing


def test_a_dict_of_records_and_a_list_of_records_each_become_a_table():
    lines = summarize._json_section({"device": "gpu", "rows": 8,
                                     "per_kind": {"a": {"us": 1.5}, "b": {"us": 2.0}},
                                     "cells": [{"kind": "a", "n": 1}, {"kind": "b", "n": 2}]})
    assert lines[0] == "device: gpu, rows: 8"
    assert lines[lines.index("#### per_kind") + 2:][:4] == [
        "| name | us |", "|---|---|", "| a | 1.5 |", "| b | 2 |"]
    assert lines[lines.index("#### cells") + 2:][:4] == [
        "| kind | n |", "|---|---|", "| a | 1 |", "| b | 2 |"]
