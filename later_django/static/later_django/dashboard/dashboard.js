// The later dashboard: live counts and figures from the JSON endpoints, the
// queue-length graph. No library: the page works without it, this only keeps
// it current. Times stay as the server wrote them: in the admin's time zone,
// which they name (not the browser's, which would differ from the admin's).
(function () {
  "use strict";
  const REFRESH_MS = 1000;
  const SAMPLES_REFRESH_MS = 60000;

  function formatDuration(ms) {
    if (ms === null || ms === undefined) return "—";
    if (ms < 1000) return Math.round(ms) + " ms";
    const s = ms / 1000;
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }

  function formatBytes(n) {
    let size = n;
    for (const unit of ["B", "KiB", "MiB", "GiB"]) {
      if (size < 1024) return unit === "B" ? size + " B" : size.toFixed(1) + " " + unit;
      size /= 1024;
    }
    return size.toFixed(1) + " TiB";
  }

  function field(data, path) {
    return path.split(".").reduce((v, k) => (v === null || v === undefined ? v : v[k]), data);
  }

  const SVG = "http://www.w3.org/2000/svg";
  const MINUTE = 60000;
  const HOUR = 60 * MINUTE;
  const DAY = 24 * HOUR;
  // The time axis's steps, the smallest that gives at most AXIS_TICKS labels.
  const AXIS_STEPS = [MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE,
    HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY];
  const AXIS_TICKS = 8;

  // The admin's time zone (the page names it, as the server wrote every
  // time in it): wall-clock times there, from epoch milliseconds.
  function zoneClock(zone) {
    let parts;
    try {
      parts = new Intl.DateTimeFormat("en-US", {
        timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit",
      });
    } catch (error) {
      return null;  // not a zone the browser knows (a fixed offset, say)
    }
    // How far the zone's wall clock is ahead of UTC at ``ms``.
    function offset(ms) {
      const p = Object.fromEntries(parts.formatToParts(ms).map((x) => [x.type, Number(x.value)]));
      const wall = Date.UTC(p.year, p.month - 1, p.day, p.hour % 24, p.minute, p.second);
      return wall - Math.floor(ms / 1000) * 1000;
    }
    return { offset };
  }

  const pad = (n) => String(n).padStart(2, "0");

  // Labels along the graph's x axis: round times of the admin's zone
  // between t0 and t1, as {at: epoch ms, text}.
  function timeTicks(t0, t1, clock) {
    const span = t1 - t0;
    const step = AXIS_STEPS.find((s) => span / s <= AXIS_TICKS) || AXIS_STEPS[AXIS_STEPS.length - 1];
    const offset = clock ? clock.offset : () => 0;
    const ticks = [];
    let previousDay = null;
    for (let wall = Math.ceil((t0 + offset(t0)) / step) * step; ; wall += step) {
      const at = wall - offset(wall - offset(t0));
      if (at > t1) break;
      if (at < t0) continue;
      const local = new Date(at + offset(at));
      const day = pad(local.getUTCMonth() + 1) + "-" + pad(local.getUTCDate());
      const time = pad(local.getUTCHours()) + ":" + pad(local.getUTCMinutes());
      let text = time;
      if (step >= DAY) text = day;
      else if (span > 12 * HOUR && day !== previousDay) text = day + " " + time;
      previousDay = day;
      ticks.push({ at, text });
    }
    return ticks;
  }

  function drawBars(svg, series) {
    svg.replaceChildren();
    const max = Math.max(1, ...series);
    const width = 600 / series.length;
    series.forEach((n, i) => {
      const h = (n / max) * 58;
      const rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("x", String(i * width + 1));
      rect.setAttribute("y", String(60 - h));
      rect.setAttribute("width", String(Math.max(1, width - 2)));
      rect.setAttribute("height", String(h));
      const title = document.createElementNS(SVG, "title");
      title.textContent = n + " stage changes, " + (series.length - i) + " s ago";
      rect.appendChild(title);
      svg.appendChild(rect);
    });
  }

  function drawQueue(svg, axis, data) {
    svg.replaceChildren();
    axis.replaceChildren();
    const points = data.points;
    if (!points.length) {
      const text = document.createElementNS(SVG, "text");
      text.setAttribute("x", "10");
      text.setAttribute("y", "100");
      text.textContent = "No sample yet: a worker takes one a minute.";
      svg.appendChild(text);
      return;
    }
    if (points.length === 1) points.push([points[0][0] + 60000, ...points[0].slice(1)]);
    const series = ["ready", "scheduled", "partitioned", "running"];
    const col = (name) => data.columns.indexOf(name);
    const t0 = points[0][0];
    const t1 = Math.max(points[points.length - 1][0], t0 + 1);
    const max = Math.max(1, ...points.flatMap((p) => series.map((s) => p[col(s)])));
    const x = (t) => ((t - t0) / (t1 - t0)) * 790 + 5;
    const y = (v) => 195 - (v / max) * 180;
    for (const name of series) {
      const path = document.createElementNS(SVG, "path");
      path.setAttribute("class", "later-series-" + name);
      path.setAttribute("d", points.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[col(name)]).toFixed(1)).join(" "));
      svg.appendChild(path);
    }
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("x", "8");
    label.setAttribute("y", "12");
    label.textContent = "max " + max.toLocaleString();
    svg.appendChild(label);
    const clock = zoneClock(axis.dataset.timeZone);
    // A zone the browser cannot place: the axis is in UTC, and says so.
    drawAxis(svg, axis, timeTicks(t0, t1, clock), x, clock ? axis.dataset.zoneLabel : "UTC");
  }

  // The time axis under the graph: a grid line in the graph and a label
  // under it per tick (HTML, so the graph's stretching does not distort
  // it), and the zone the times are in at the end.
  function drawAxis(svg, axis, ticks, x, zoneLabel) {
    for (const tick of ticks) {
      const line = document.createElementNS(SVG, "line");
      line.setAttribute("class", "later-grid");
      line.setAttribute("x1", x(tick.at).toFixed(1));
      line.setAttribute("x2", x(tick.at).toFixed(1));
      line.setAttribute("y1", "0");
      line.setAttribute("y2", "200");
      svg.insertBefore(line, svg.firstChild);
      if (x(tick.at) > 750) continue;  // its label would run into the zone's
      const text = document.createElement("span");
      text.className = "later-tick";
      text.dataset.ms = String(tick.at);
      text.style.left = (x(tick.at) / 8).toFixed(2) + "%";  // of the 800 wide view box
      text.textContent = tick.text;
      axis.appendChild(text);
    }
    const zone = document.createElement("span");
    zone.className = "later-axis-zone";
    zone.textContent = zoneLabel;
    axis.appendChild(zone);
  }

  async function getJson(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(url + ": " + response.status);
    return response.json();
  }

  function renderServers(tbody, servers, jobsUrl) {
    tbody.replaceChildren();
    if (!servers.length) {
      const row = tbody.insertRow();
      const cell = row.insertCell();
      cell.colSpan = 9;
      cell.textContent = "No live server.";
      return;
    }
    for (const s of servers) {
      const row = tbody.insertRow();
      const id = row.insertCell();
      id.className = "later-server-id";
      id.textContent = s.id;
      // A server of a release before queues (none recorded) claims from every queue.
      const queues = s.queues === null ? "every (previous release: ignores pause)" : s.queues.join(", ");
      // A server of a release before versions were recorded has none.
      const version = s.version === null ? "unrecorded" : s.version;
      for (const value of [s.hostname, s.pid, version, s.workers, queues, s.topics ? "yes" : "no", formatDuration(s.heartbeat_age_ms) + " ago"]) {
        row.insertCell().textContent = String(value);
      }
      const running = row.insertCell();
      if (!s.running.length) running.textContent = "—";
      s.running.forEach((job, i) => {
        if (i) running.appendChild(document.createElement("br"));
        const link = document.createElement("a");
        link.href = jobsUrl + job.id + "/";
        link.title = job.id;
        link.textContent = "…" + job.id.slice(-6);
        running.append(link, " " + job.type);
      });
    }
  }

  function startOverview(root) {
    let refreshed = 0;
    const spark = document.getElementById("later-throughput");
    async function refresh() {
      try {
        const data = await getJson(root.dataset.api);
        for (const el of document.querySelectorAll("[data-stage-count]")) {
          el.textContent = String(data.counts[el.dataset.stageCount]);
        }
        for (const el of root.querySelectorAll("[data-field]")) {
          const value = field(data, el.dataset.field);
          el.textContent = el.dataset.format === "bytes" ? formatBytes(value) : String(value);
        }
        for (const row of root.querySelectorAll("#later-waits tr[data-lane]")) {
          const waits = data.waits[row.dataset.lane] || {};
          for (const cell of row.querySelectorAll("[data-wait]")) {
            const value = waits[cell.dataset.wait];
            cell.textContent = cell.dataset.wait === "count" ? String(value || 0) : formatDuration(value);
          }
        }
        drawBars(spark, data.throughput.series);
        renderServers(root.querySelector("#later-servers tbody"), data.servers, root.dataset.jobs);
        refreshed += 1;
        document.body.dataset.refreshed = String(refreshed);
      } catch (error) {
        console.warn("later dashboard: refresh failed", error);
      }
    }
    let range = "24h";
    const graph = document.getElementById("later-queue-graph");
    const axis = document.getElementById("later-queue-axis");
    async function refreshSamples() {
      try {
        drawQueue(graph, axis, await getJson(root.dataset.samples + "?range=" + range));
      } catch (error) {
        console.warn("later dashboard: samples failed", error);
      }
    }
    for (const button of root.querySelectorAll("[data-range]")) {
      button.addEventListener("click", () => {
        range = button.dataset.range;
        for (const b of root.querySelectorAll("[data-range]")) b.setAttribute("aria-pressed", String(b === button));
        refreshSamples();
      });
    }
    refresh();
    refreshSamples();
    setInterval(refresh, REFRESH_MS);
    setInterval(refreshSamples, SAMPLES_REFRESH_MS);
  }

  function startJobs() {
    const all = document.getElementById("later-select-all");
    if (all) {
      all.addEventListener("change", () => {
        for (const box of document.querySelectorAll('#later-jobs input[name="job"]')) box.checked = all.checked;
      });
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const overview = document.getElementById("later-overview");
    if (overview) startOverview(overview);
    startJobs();
  });
})();
