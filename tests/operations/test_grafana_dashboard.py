"""The Grafana dashboard and the Prometheus alert rules in docs/grafana: they
parse, they name only metric families later_django exports, and they read
``later_queue_jobs`` (the same value in every process) with ``max``.

Pure file checks: no database, no Prometheus. PyYAML is not a dependency, so
alerts.yml is read by a small parser of the YAML subset the file is written
in (block mappings and sequences, plain and quoted scalars, ``|`` blocks,
comments); it refuses anything else. When PyYAML happens to be installed,
one more test checks that it reads the file the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.helpers import PROJECT_DIR

DASHBOARD = PROJECT_DIR / "docs" / "grafana" / "later-dashboard.json"
ALERTS = PROJECT_DIR / "docs" / "grafana" / "alerts.yml"
METRICS_DOC = PROJECT_DIR / "docs" / "reference" / "metrics.md"

COUNTERS = {
    "later_job_transitions_total",
    "later_worker_commands_total",
    "later_partition_claims_total",
    "later_partition_heads_claimed_total",
    "later_partition_lease_renewals_total",
}
HISTOGRAMS = {
    "later_job_handler_duration_seconds",
    "later_job_duration_seconds",
    "later_job_wait_duration_seconds",
}
GAUGES = {
    "later_queue_jobs",
    "later_workers",
    "later_partitions_active",
    "later_partition_workers_live",
    "later_partition_backlog",
    "later_partition_oldest_head_age_seconds",
    "later_partition_queue_depth",
    "later_retained_log_consumer_lag",
}
PARTITION_FAMILIES = {
    "later_partition_claims_total",
    "later_partition_heads_claimed_total",
    "later_partition_lease_renewals_total",
    "later_partitions_active",
    "later_partition_workers_live",
    "later_partition_backlog",
    "later_partition_oldest_head_age_seconds",
    "later_partition_queue_depth",
    "later_retained_log_consumer_lag",
}
# The names a query can select: counters end in _total, and a histogram
# exists only as its _bucket, _sum and _count series.
SERIES_NAMES = (
    COUNTERS | GAUGES | {h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)
PARTITIONS_ROW = "Partitions (when topics are configured)"
DATASOURCE_UID = "${DS_PROMETHEUS}"

# A whole identifier that starts with later_, so that a misspelt or unknown
# name is caught whole rather than by its first letters.
METRIC_NAME = re.compile(r"(?<![\w:])later_[\w:]*")
AGGREGATORS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
}
ALERT_KEYS = {"alert", "expr", "for", "labels", "annotations"}
DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


# -- reading the files --------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, rows and the panels of collapsed rows included."""
    found = []
    for panel in panels:
        found.append(panel)
        found.extend(all_panels(panel.get("panels", [])))
    return found


def dashboard_exprs() -> list[str]:
    return [
        target["expr"]
        for panel in all_panels(load_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def load_alerts() -> Any:
    return parse_yaml_subset(ALERTS.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_alerts()["groups"] for rule in group["rules"]]


def all_exprs() -> list[str]:
    return dashboard_exprs() + [rule["expr"] for rule in alert_rules()]


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(blank_strings(expr)))


def family(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return name[: -len(suffix)]
    return name


# -- PromQL: which aggregation reads a metric ---------------------------------


def blank_strings(expr: str) -> str:
    """``expr`` with the inside of every quoted string replaced by spaces
    (positions kept): a parenthesis in a label value is not syntax."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: '"' + " " * (len(m.group()) - 2) + '"', expr)


def call_name(expr: str, paren: int) -> str:
    """The function or aggregation whose opening parenthesis is at ``paren``,
    also in the ``max by (queue) (...)`` form; "" for a grouping parenthesis."""
    before = expr[:paren].rstrip()
    if before.endswith(")"):  # the (labels) of a `by`/`without` clause
        depth = 0
        for i in range(len(before) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(before[i], 0)
            if depth == 0:
                before = before[:i].rstrip()
                break
        clause = re.search(r"\b(?:by|without)$", before)
        if clause is None:
            return ""
        before = before[: clause.start()].rstrip()
    name = re.search(r"[A-Za-z_][A-Za-z0-9_]*$", before)
    return name.group() if name else ""


def enclosing_calls(expr: str, position: int) -> list[str]:
    """The calls whose parentheses enclose ``position``, innermost first."""
    expr = blank_strings(expr)
    names = []
    depth = 0
    for i in range(position - 1, -1, -1):
        if expr[i] == ")":
            depth += 1
        elif expr[i] == "(":
            if depth:
                depth -= 1
            else:
                names.append(call_name(expr, i))
    return names


def calls_around(expr: str, metric: str) -> list[list[str]]:
    """For each selector of ``metric`` in ``expr``, the calls around it,
    innermost first."""
    pattern = re.compile(rf"(?<![\w:]){re.escape(metric)}(?![\w:])")
    return [enclosing_calls(expr, match.start()) for match in pattern.finditer(blank_strings(expr))]


def aggregations_of(expr: str, metric: str) -> list[list[str]]:
    """For each selector of ``metric`` in ``expr``, the aggregation operators
    around it, innermost first."""
    return [[name for name in calls if name in AGGREGATORS] for calls in calls_around(expr, metric)]


def queue_jobs_problem(expr: str) -> str | None:
    """Why ``expr`` reads later_queue_jobs wrongly, or None. Every process
    reports the same value, so it must first be aggregated with max, and no
    sum may add the copies up."""
    for aggregations in aggregations_of(expr, "later_queue_jobs"):
        if not aggregations:
            return "later_queue_jobs is not aggregated (one series per scraped process)"
        if aggregations[0] != "max":
            return f"later_queue_jobs is aggregated with {aggregations[0]}, not max"
        if "sum" in aggregations:
            return "later_queue_jobs is summed"
    return None


def balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in blank_strings(expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


# -- a parser of the YAML subset alerts.yml is written in ---------------------


class YamlSubsetError(ValueError):
    pass


_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*):(?: +|$)")
# Plain scalars that YAML may not read as a string, refused: bools, null,
# and number-like forms other than plain ints, decimals and durations (1e3,
# 0x1f, 1_000, 1:30, .5, .inf, a date), which YAML 1.1 and 1.2 read apart.
_NOT_A_STRING = re.compile(r"(yes|no|on|off|y|n|~|null|true|false)", re.I)
_DURATION = re.compile(r"[0-9]+[a-z]+")


def _scalar(text: str, lineno: int) -> Any:
    """A one-line scalar with its trailing comment, if any."""

    def fail(why: str) -> YamlSubsetError:
        return YamlSubsetError(f"line {lineno}: {why}: {text!r}")

    if text[:1] in ('"', "'"):
        quote = text[0]
        value = []
        i = 1
        while True:
            if i >= len(text):
                raise fail("unterminated quoted scalar")
            char = text[i]
            if quote == '"' and char == "\\":
                if text[i + 1 : i + 2] not in ('"', "\\"):
                    raise fail('escape other than \\" or \\\\')
                value.append(text[i + 1])
                i += 2
            elif char == quote and quote == "'" and text[i + 1 : i + 2] == "'":
                value.append("'")
                i += 2
            elif char == quote:
                break
            else:
                value.append(char)
                i += 1
        rest = text[i + 1 :]
        if rest.strip() and not re.match(r"\s+#", rest):
            raise fail("text after a quoted scalar")
        return "".join(value)
    comment = re.search(r"\s#", text)
    plain = (text[: comment.start()] if comment else text).strip()
    if not plain:
        raise fail("empty scalar")
    if plain[0] in "[]{}&*!|>%@`#,?" or plain.startswith("- ") or plain == "-":
        raise fail("flow collection, anchor, tag or indicator")
    if ": " in plain or plain.endswith(":"):
        raise fail("': ' in a plain scalar")
    if re.fullmatch(r"-?[0-9]+", plain):
        return int(plain)
    if re.fullmatch(r"-?[0-9]+\.[0-9]+", plain):
        return float(plain)
    if plain in ("true", "false"):
        return plain == "true"
    if _NOT_A_STRING.fullmatch(plain) or (
        plain[0] in "-+.0123456789" and not _DURATION.fullmatch(plain)
    ):
        raise fail("plain scalar YAML could read as a number, bool, date or null")
    return plain


class _YamlSubset:
    def __init__(self, text: str) -> None:
        if "\t" in text:
            raise YamlSubsetError("tab character")
        self.lines = text.split("\n")
        self.i = 0

    def significant(self) -> tuple[int, str] | None:
        """Skips blank and comment lines; the next line's indent and text."""
        while self.i < len(self.lines):
            content = self.lines[self.i].lstrip(" ")
            if content and not content.startswith("#"):
                return len(self.lines[self.i]) - len(content), content
            self.i += 1
        return None

    def error(self, why: str) -> YamlSubsetError:
        line = self.lines[self.i] if self.i < len(self.lines) else ""
        return YamlSubsetError(f"line {self.i + 1}: {why}: {line!r}")

    def document(self) -> Any:
        first = self.significant()
        if first is None:
            return None
        if first[0] != 0:
            raise self.error("the document does not start at column 0")
        value = self.node(0)
        if self.significant() is not None:
            raise self.error("text after the document")
        return value

    def node(self, indent: int) -> Any:
        line = self.significant()
        assert line is not None
        if line[1] == "-" or line[1].startswith("- "):
            return self.sequence(indent)
        if _KEY.match(line[1]):
            return self.mapping(indent)
        value = _scalar(line[1], self.i + 1)
        self.i += 1
        return value

    def mapping(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while (line := self.significant()) is not None and line[0] >= indent:
            if line[0] > indent:
                raise self.error("unexpected indentation")
            key = _KEY.match(line[1])
            if key is None:
                raise self.error("expected 'key:'")
            if key.group(1) in result:
                raise self.error(f"duplicate key {key.group(1)!r}")
            self.i += 1
            result[key.group(1)] = self.value(line[1][key.end() :], indent)
        return result

    def value(self, rest: str, indent: int) -> Any:
        if rest in ("|", "|-"):
            return self.block_scalar(indent, keep_newline=rest == "|")
        if rest.strip() and not rest.lstrip().startswith("#"):
            return _scalar(rest, self.i)
        line = self.significant()
        if line is None:
            return None
        if line[0] > indent:
            return self.node(line[0])
        if line[0] == indent and (line[1] == "-" or line[1].startswith("- ")):
            return self.sequence(indent)
        return None

    def sequence(self, indent: int) -> list[Any]:
        items = []
        while (line := self.significant()) is not None and line[0] >= indent:
            if line[0] > indent:
                raise self.error("unexpected indentation")
            if not (line[1] == "-" or line[1].startswith("- ")):
                break
            after = line[1][1:].lstrip(" ")
            if not after or after.startswith("#"):
                self.i += 1
                nested = self.significant()
                if nested is None or nested[0] <= indent:
                    raise self.error("empty sequence item")
                items.append(self.node(nested[0]))
            else:
                # The item's content starts on this line: read it as if it
                # were indented to its own column.
                column = indent + len(line[1]) - len(after)
                self.lines[self.i] = " " * column + after
                items.append(self.node(column))
        return items

    def block_scalar(self, indent: int, *, keep_newline: bool) -> str:
        body: list[str] = []
        content_indent = None
        while self.i < len(self.lines):
            raw = self.lines[self.i]
            stripped = raw.lstrip(" ")
            if stripped:
                line_indent = len(raw) - len(stripped)
                if content_indent is None:
                    if line_indent <= indent:
                        break
                    content_indent = line_indent
                elif line_indent < content_indent:
                    break
                body.append(raw[content_indent:])
            else:
                body.append("")
            self.i += 1
        while body and not body[-1]:
            body.pop()
            self.i -= 1  # leave trailing blank lines to the caller
        if not body:
            raise self.error("empty block scalar")
        return "\n".join(body) + ("\n" if keep_newline else "")


def parse_yaml_subset(text: str) -> Any:
    return _YamlSubset(text).document()


# -- the checkers' own tests --------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        'max(later_queue_jobs{state="enqueued"})',
        'max by (queue) (later_queue_jobs{queue=~"$queue", state="enqueued"}) > 1000',
        'max(later_queue_jobs{state="enqueued"}) by (queue)',
        'deriv(max by (queue) (later_queue_jobs{state="enqueued"})[15m:1m]) > 0',
        'sum(later_workers{state="active"}) == 0 and on () max(later_queue_jobs) > 0',
    ],
)
def test_queue_jobs_check_accepts_max(expr):
    assert queue_jobs_problem(expr) is None


@pytest.mark.parametrize(
    "expr",
    [
        'sum(later_queue_jobs{state="enqueued"})',
        'sum by (state) (later_queue_jobs{state=~"(enqueued|delayed)"})',
        'later_queue_jobs{state="enqueued"} > 0',
        "sum(max by (queue) (later_queue_jobs))",
        "avg(later_queue_jobs) + max(later_queue_jobs)",
        'max(later_workers) and sum without (instance) (later_queue_jobs{state="running"})',
        "max(deriv(later_queue_jobs[15m])) or later_queue_jobs",
    ],
)
def test_queue_jobs_check_refuses_sums_and_bare_selectors(expr):
    assert queue_jobs_problem(expr) is not None


def test_metric_names_are_read_whole_and_outside_strings():
    expr = (
        'sum by (le) (rate(later_job_wait_duration_seconds_bucket{job_type="later_x"}[5m])) '
        "/ later_queue_jobs2 + later_workers:ratio"
    )
    assert metric_names(expr) == {
        "later_job_wait_duration_seconds_bucket",
        "later_queue_jobs2",
        "later_workers:ratio",
    }
    assert metric_names(expr) - SERIES_NAMES == {"later_queue_jobs2", "later_workers:ratio"}


def test_yaml_subset_parser_reads_what_yaml_reads():
    text = (
        "# comment\n"
        "groups:\n"
        "  - name: g  # trailing comment\n"
        "    rules:\n"
        "      # a comment between items\n"
        "      - alert: A\n"
        "        expr: |\n"
        '          max(x{a="b"}) > 1\n'
        "\n"
        "          and y\n"
        "\n"
        "      - alert: B\n"
        '        expr: sum(z{outcome="discarded"}) > 0\n'
        "        for: 5m\n"
        "        labels:\n"
        "          severity: warning\n"
        "        annotations:\n"
        '          summary: "a \\"quoted\\" {{ $labels.queue }}: x"\n'
        "          other: 'it''s'\n"
        "        count: 12\n"
        "    list:\n"
        "    - 1.5\n"
        "    - true\n"
    )
    assert parse_yaml_subset(text) == {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"alert": "A", "expr": 'max(x{a="b"}) > 1\n\nand y\n'},
                    {
                        "alert": "B",
                        "expr": 'sum(z{outcome="discarded"}) > 0',
                        "for": "5m",
                        "labels": {"severity": "warning"},
                        "annotations": {
                            "summary": 'a "quoted" {{ $labels.queue }}: x',
                            "other": "it's",
                        },
                        "count": 12,
                    },
                ],
                "list": [1.5, True],
            }
        ]
    }


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\na: 2\n",  # duplicate key
        "a: {b: 1}\n",  # flow mapping
        "a: [1, 2]\n",  # flow sequence
        "a: &x 1\n",  # anchor
        "a: yes\n",  # a bool in YAML 1.1
        "a: 1e3\n",  # a float in YAML 1.2, a string in 1.1
        "a: b: c\n",  # ': ' in a plain scalar
        "a:\n\tb: 1\n",  # tab
        "a:\n  b: 1\n c: 2\n",  # bad indentation
        'a: "x" y\n',  # text after a quoted scalar
        'a: "x\\n"\n',  # an escape the subset does not read
        "a: >\n  folded\n",  # folded block scalar
        "a: |\n",  # empty block scalar at the end
    ],
)
def test_yaml_subset_parser_refuses_what_it_does_not_read(text):
    with pytest.raises(YamlSubsetError):
        parse_yaml_subset(text)


# -- the dashboard ------------------------------------------------------------


def test_dashboard_is_an_importable_grafana_dashboard():
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"]
    assert dashboard["id"] is None  # a fixed id would clash on import
    (source,) = dashboard["__inputs"]
    assert source["name"] == "DS_PROMETHEUS"
    assert (source["type"], source["pluginId"]) == ("datasource", "prometheus")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    # A datasource variable of the same name, so that ${DS_PROMETHEUS} also
    # resolves when the file is provisioned (provisioning ignores __inputs).
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"


def test_dashboard_every_panel_and_query_uses_the_templated_datasource():
    panels = [p for p in all_panels(load_dashboard()["panels"]) if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_dashboard_job_type_variable_lists_the_job_types_with_all():
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    job_type = variables["job_type"]
    assert job_type["type"] == "query"
    assert job_type["includeAll"] is True
    assert job_type["datasource"]["uid"] == DATASOURCE_UID
    query = job_type["query"]
    query = query["query"] if isinstance(query, dict) else query
    assert query == "label_values(later_job_transitions_total, job_type)"


def test_dashboard_queries_use_only_defined_variables():
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    used = {
        name
        for expr in dashboard_exprs()
        for name in re.findall(r"\$\{?(\w+)", expr)
        if not name.startswith("__")  # Grafana's own, like $__rate_interval
    }
    assert used
    assert used <= defined


def test_dashboard_panel_ids_are_unique():
    ids = [panel["id"] for panel in all_panels(load_dashboard()["panels"])]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids))


def overlaps(a: dict[str, int], b: dict[str, int]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


def test_dashboard_panels_have_a_grid_position_and_do_not_overlap():
    top = load_dashboard()["panels"]
    layouts = [top] + [row["panels"] for row in top if row["type"] == "row" and row["collapsed"]]
    for layout in layouts:
        for panel in layout:
            grid = panel["gridPos"]
            assert set(grid) == {"h", "w", "x", "y"}, panel["title"]
            assert all(isinstance(v, int) for v in grid.values()), panel["title"]
            assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["y"] >= 0
            assert grid["x"] + grid["w"] <= 24, panel["title"]
        for i, a in enumerate(layout):
            for b in layout[i + 1 :]:
                assert not overlaps(a["gridPos"], b["gridPos"]), (a["title"], b["title"])
    for row in top:
        if row["type"] == "row" and row["collapsed"]:
            assert all(p["gridPos"]["y"] > row["gridPos"]["y"] for p in row["panels"])
        elif row["type"] == "row":
            assert row["panels"] == []  # an open row's panels are top-level ones


def test_dashboard_partition_metrics_are_in_the_collapsed_partitions_row():
    top = load_dashboard()["panels"]
    (row,) = [p for p in top if p["type"] == "row" and p["title"] == PARTITIONS_ROW]
    assert row["collapsed"] is True
    inside = {
        family(name)
        for panel in row["panels"]
        for target in panel["targets"]
        for name in metric_names(target["expr"])
    }
    outside = {
        family(name)
        for panel in top
        for target in panel.get("targets", [])
        for name in metric_names(target["expr"])
    }
    assert inside == PARTITION_FAMILIES
    assert not outside & PARTITION_FAMILIES


def test_dashboard_shows_every_metric_family():
    used = {family(name) for expr in dashboard_exprs() for name in metric_names(expr)}
    assert used == COUNTERS | HISTOGRAMS | GAUGES


def test_dashboard_latency_panels_are_quantiles_of_bucket_rates_by_le():
    quantile_call = re.compile(
        r"histogram_quantile\((0\.\d+), sum by \(([^)]*)\) "
        r"\(rate\((later_\w+)\{[^}]*\}\[5m\]\)\)\)"
    )
    quantiles: dict[str, set[str]] = {}
    for expr in dashboard_exprs():
        calls = expr.count("histogram_quantile(")
        found = quantile_call.findall(expr)
        assert len(found) == calls, expr
        for q, labels, series in found:
            assert "le" in [label.strip() for label in labels.split(",")], expr
            assert series.endswith("_bucket") and series[: -len("_bucket")] in HISTOGRAMS, expr
            quantiles.setdefault(series, set()).add(q)
    for histogram in ("later_job_handler_duration_seconds", "later_job_wait_duration_seconds"):
        assert {"0.5", "0.95", "0.99"} <= quantiles[histogram + "_bucket"]
    assert "0.95" in quantiles["later_job_duration_seconds_bucket"]


# -- the alert rules ----------------------------------------------------------


def test_alerts_file_is_groups_of_rules():
    alerts = load_alerts()
    assert set(alerts) == {"groups"}
    assert alerts["groups"]
    names = []
    for group in alerts["groups"]:
        assert set(group) == {"name", "rules"}
        assert isinstance(group["name"], str) and group["name"]
        assert group["rules"]
        for rule in group["rules"]:
            assert set(rule) == ALERT_KEYS, rule.get("alert")
            assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["alert"])
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            assert DURATION.match(rule["for"]), rule["alert"]
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert all(isinstance(v, str) for v in rule["labels"].values())
            assert set(rule["annotations"]) == {"summary", "description"}
            assert all(v.strip() for v in rule["annotations"].values())
            names.append(rule["alert"])
    assert len(names) == len(set(names))


def test_alerts_cover_backlog_workers_failures_partitions_and_consumer_lag():
    rules = {rule["alert"]: rule for rule in alert_rules()}
    backlog = rules["LaterBacklogGrowing"]["expr"]
    assert 'later_queue_jobs{state="enqueued"}' in backlog
    assert re.search(r"deriv\(.*\[15m:", backlog)
    assert re.search(r"\) > [0-9]+", backlog)  # and above a threshold
    no_workers = rules["LaterNoLiveWorkers"]
    assert 'absent(sum(later_workers{state="active"}))' in no_workers["expr"]
    assert 'sum(later_workers{state="active"}) == 0' in no_workers["expr"]
    assert 'max(later_queue_jobs{state="enqueued"}) > 0' in no_workers["expr"]
    assert no_workers["for"] == "2m"
    assert rules["LaterNoLiveWorkers"]["labels"]["severity"] == "critical"
    failures = rules["LaterJobFailureRateHigh"]["expr"]
    assert 'later_job_transitions_total{state="failed"}' in failures
    assert "later_partition_oldest_head_age_seconds" in rules["LaterPartitionHeadStuck"]["expr"]
    assert "later_retained_log_consumer_lag" in rules["LaterConsumerLagHigh"]["expr"]


def test_alerts_parse_the_same_with_pyyaml():
    import yaml  # a test dependency

    assert yaml.safe_load(ALERTS.read_text()) == load_alerts()


# -- both files ---------------------------------------------------------------


def test_queries_name_only_exported_series():
    exprs = all_exprs()
    assert len(exprs) > 20
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= SERIES_NAMES, (sorted(names - SERIES_NAMES), expr)


def test_queries_read_later_queue_jobs_with_max_never_sum():
    reading = [expr for expr in all_exprs() if "later_queue_jobs" in expr]
    assert len(reading) >= 4
    for expr in reading:
        assert queue_jobs_problem(expr) is None, (queue_jobs_problem(expr), expr)


def test_queries_add_up_live_workers_across_processes():
    """later_workers counts the worker tasks of one process: the cluster's
    figure is their sum (absent() only asks whether any process reports)."""
    reading = 0
    for expr in all_exprs():
        for calls in calls_around(expr, "later_workers"):
            reading += 1
            if calls[:1] == ["absent"]:
                continue
            aggregations = [name for name in calls if name in AGGREGATORS]
            assert aggregations and aggregations[0] == "sum", expr
    assert reading >= 6


def test_queries_have_balanced_brackets():
    for expr in all_exprs():
        assert balanced(expr), expr


def test_metrics_doc_describes_every_metric_family():
    text = METRICS_DOC.read_text()
    for name in COUNTERS | HISTOGRAMS | GAUGES:
        assert f"`{name}`" in text, name
