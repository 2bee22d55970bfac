// Hourglass console: the fleet, a sensor's chart and the ingest health,
// from the service's own API. No build step; uPlot draws the charts.
'use strict';
(() => {
  const TOKEN_KEY = 'hourglass.token';
  const PAGE = 50;
  const REFRESH_MS = 5000;
  // Fixed steps the series API takes, in seconds; longer ones are calendar steps.
  const STEPS = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200];
  const BROWSER_TZ = Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';

  const $ = (id) => document.getElementById(id);
  const state = {
    config: { auth: false },
    pages: [null], page: 0, next: null, glob: '', label: null,
    sensor: null, info: null, metric: null, range: 86400, custom: null,
    tz: BROWSER_TZ, groupBy: '', weighting: 'readings', health: null,
  };
  // For tests and the curious: the charts and the requests behind them.
  const hg = window.hourglass = { state, charts: {}, urls: {} };

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  // --- API -----------------------------------------------------------------

  // A busy server answers 503 with Retry-After: ask again, twice, waiting
  // as long as it says (one to ten seconds).
  async function api(path, raw) {
    const headers = {};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = 'Bearer ' + token;
    let r = await fetch(path, { headers });
    for (let attempt = 0; r.status === 503 && attempt < 2; attempt++) {
      const wait = Math.min(10, Math.max(1, Number(r.headers.get('Retry-After')) || 1));
      await new Promise((done) => setTimeout(done, wait * 1000));
      r = await fetch(path, { headers });
    }
    if (r.status === 401) {
      askToken(token ? 'That token was refused.' : '');
      throw new ApiError(401, 'A token is needed.');
    }
    if (!r.ok) {
      let message = r.statusText || ('HTTP ' + r.status);
      try { message = (await r.json()).error || message; } catch (_) { /* not JSON */ }
      throw new ApiError(r.status, message);
    }
    return raw ? r : r.json();
  }

  function askToken(message) {
    const dialog = $('login');
    $('login-error').textContent = message || '';
    if (!dialog.open) dialog.showModal();
    $('token').focus();
  }

  function signedIn() {
    return !state.config.auth || !!sessionStorage.getItem(TOKEN_KEY);
  }

  // --- Formatting -----------------------------------------------------------

  const enc = encodeURIComponent;

  function fmtNumber(x) {
    if (x === null || x === undefined || Number.isNaN(x)) return '–';
    const a = Math.abs(x);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return x.toExponential(3);
    return String(Math.round(x * 1000) / 1000);
  }

  function fmtBytes(n) {
    if (!Number.isFinite(n)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i ? n.toFixed(1) : String(n)) + ' ' + units[i];
  }

  function fmtTime(iso) {
    if (!iso) return '–';
    const d = new Date(iso);
    const opts = { dateStyle: 'medium', timeStyle: 'medium', timeZone: state.tz };
    try { return new Intl.DateTimeFormat(undefined, opts).format(d); } catch (_) { return iso; }
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v; else if (k.startsWith('data-')) e.setAttribute(k, v); else e[k] = v;
    }
    for (const c of children) e.append(c);
    return e;
  }

  // --- Fleet -----------------------------------------------------------------

  async function loadFleet() {
    const status = $('fleet-status');
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (state.glob) q.set('sensor', state.glob);
    if (state.label) q.set('label.' + state.label[0], state.label[1]);
    const after = state.pages[state.page];
    if (after) q.set('after', after);
    status.textContent = 'Loading sensors…';
    let body;
    try {
      body = await api('/api/v1/sensors?' + q);
    } catch (e) {
      status.textContent = e.status === 401 ? 'Sign in to see the fleet.' : 'The sensors could not be listed: ' + e.message;
      return;
    }
    const tbody = $('sensors').tBodies[0];
    tbody.replaceChildren();
    tbody.dataset.silent = '';
    for (const s of body.sensors) {
      const open = el('button', { type: 'button', class: 'link', textContent: s.sensor });
      open.addEventListener('click', () => { location.hash = 'sensor=' + enc(s.sensor); });
      const labels = Object.entries(s.labels || {}).map(([k, v]) => k + '=' + v).join(', ');
      const value = el('td', { class: 'num', 'data-sensor': s.sensor }, '…');
      const seen = el('td', {}, s.last_seen ? fmtTime(s.last_seen) : '–');
      tbody.append(el('tr', { 'data-sensor': s.sensor },
        el('td', {}, open), el('td', {}, labels), el('td', {}, s.metrics.join(', ')), value, seen));
      fillLatest(s, value, seen);
    }
    markSilent(q, body.sensors, tbody);
    const first = state.page * PAGE + 1;
    status.textContent = body.sensors.length
      ? `Sensors ${first}–${first + body.sensors.length - 1}`
      : 'No sensors match.';
    state.next = body.next;
    $('prev').disabled = state.page === 0;
    $('next').disabled = !body.next;
  }

  // Marks the page's sensors past their expected interval: one listing of
  // the page's ids with silent=true (the service knows each interval).
  async function markSilent(q, sensors, tbody) {
    if (!sensors.length) { tbody.dataset.silent = 'checked'; return; }
    const sq = new URLSearchParams(q);
    sq.set('silent', 'true');
    sq.set('through', sensors[sensors.length - 1].sensor);
    let body;
    try {
      body = await api('/api/v1/sensors?' + sq);
    } catch (_) {
      tbody.dataset.silent = 'failed';
      return;
    }
    for (const s of body.sensors) {
      const row = tbody.querySelector(`tr[data-sensor="${CSS.escape(s.sensor)}"]`);
      if (!row) continue;
      row.classList.add('silent');
      row.cells[0].append(' ', el('span', {
        class: 'badge',
        title: s.last_reading ? 'No reading since ' + fmtTime(s.last_reading) : 'No reading yet',
        textContent: 'silent',
      }));
    }
    tbody.dataset.silent = 'checked';
  }

  async function fillLatest(s, valueCell, seenCell) {
    const metric = s.metrics[0];
    if (!metric) { valueCell.textContent = '–'; return; }
    try {
      const l = await api(`/api/v1/sensors/${enc(s.sensor)}/latest?metric=${enc(metric)}`);
      valueCell.textContent = fmtNumber(l.value) + (s.metrics.length > 1 ? ' (' + metric + ')' : '');
      seenCell.textContent = fmtTime(l.ts);
    } catch (_) {
      valueCell.textContent = '–';
    }
  }

  // --- Steps and ranges ------------------------------------------------------

  // The smallest step that keeps the points within the chart's width (about
  // one point per 3 pixels): long ranges come from rollups, so they stay cheap.
  function chooseStep(seconds, width) {
    const most = Math.max(10, Math.floor(width / 3));
    const wanted = seconds / most;
    for (const s of STEPS) if (s >= wanted) return { text: s % 3600 ? s / 60 + 'm' : s / 3600 + 'h', seconds: s };
    if (wanted <= 86400) return { text: '1d', seconds: 86400 };
    if (wanted <= 7 * 86400) return { text: '1w', seconds: 7 * 86400 };
    return { text: '1mo', seconds: 30 * 86400 };
  }

  function currentRange() {
    if (state.custom) return state.custom;
    const to = Date.now();
    return { from: to - state.range * 1000, to };
  }

  function seriesQuery(step, range) {
    const q = new URLSearchParams({
      metric: state.metric, from: String(Math.floor(range.from)), to: String(Math.floor(range.to)),
      step: step.text, tz: state.tz,
    });
    // Time-weighted averages, for sensors that report by exception.
    if (state.weighting !== 'readings') q.set('weighting', state.weighting);
    return q;
  }

  // --- Charts ------------------------------------------------------------------

  function drawChart(key, container, data, series, bands) {
    const old = hg.charts[key];
    if (old) old.destroy();
    container.replaceChildren();
    const tz = state.tz;
    const chart = new uPlot({
      width: Math.max(280, container.clientWidth),
      height: 300,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), tz),
      scales: { x: { time: true } },
      series: [{ label: 'time' }, ...series],
      bands,
      legend: { live: true },
    }, data, container);
    hg.charts[key] = chart;
    return chart;
  }

  function xs(points) {
    return points.map((p) => Date.parse(p.start) / 1000);
  }

  async function loadChart() {
    const container = $('chart');
    const caption = $('chart-caption');
    $('sensor-error').textContent = '';
    container.dataset.state = 'loading';
    const range = currentRange();
    const step = chooseStep((range.to - range.from) / 1000, container.clientWidth || 600);
    const q = seriesQuery(step, range);
    const url = `/api/v1/sensors/${enc(state.sensor)}/series?${q}`;
    hg.urls.series = url;
    caption.textContent = 'Loading…';
    let body;
    try {
      body = await api(url);
    } catch (e) {
      container.dataset.state = 'error';
      caption.textContent = '';
      $('sensor-error').textContent = e.status === 403
        ? `This token may not read sensor ${state.sensor}.`
        : 'The series could not be read: ' + e.message;
      return;
    }
    const pts = body.points;
    const data = [xs(pts), pts.map((p) => p.avg), pts.map((p) => p.min), pts.map((p) => p.max)];
    drawChart('sensor', container, data, [
      { label: 'average', stroke: '#0b5cad', width: 2, spanGaps: false },
      { label: 'min', stroke: '#6f9fd8', width: 1 },
      { label: 'max', stroke: '#6f9fd8', width: 1 },
    ], [{ series: [3, 2], fill: 'rgba(11, 92, 173, 0.15)' }]);
    Object.assign(container.dataset, {
      state: 'ready', step: step.text, tz: state.tz, from: q.get('from'), to: q.get('to'), points: String(pts.length),
    });
    const counted = pts.reduce((n, p) => n + p.count, 0);
    const weighed = state.weighting === 'readings' ? '' : ', averages weighted by time';
    caption.textContent = `${pts.length} points of ${step.text}, ${counted} readings${weighed}, times in ${state.tz}`;
    loadGroupChart(step, range);
  }

  async function loadGroupChart(step, range) {
    const container = $('group-chart');
    const caption = $('group-caption');
    if (!state.groupBy) {
      const old = hg.charts.group;
      if (old) { old.destroy(); delete hg.charts.group; }
      container.replaceChildren();
      container.dataset.state = 'none';
      caption.textContent = 'Choose a label to compare groups.';
      return;
    }
    container.dataset.state = 'loading';
    const q = seriesQuery(step, range);
    q.set('group_by', state.groupBy);
    if (state.glob) q.set('sensor', state.glob);
    if (state.label) q.set('label.' + state.label[0], state.label[1]);
    const url = '/api/v1/series?' + q;
    hg.urls.group = url;
    let body;
    try {
      body = await api(url);
    } catch (e) {
      container.dataset.state = 'error';
      caption.textContent = 'The groups could not be read: ' + e.message;
      return;
    }
    const groups = body.groups;
    const palette = ['#0b5cad', '#b35900', '#116329', '#8250df', '#a4001d', '#1b7c83', '#6e7781'];
    const first = groups.find((g) => g.points && g.points.length);
    const data = [first ? xs(first.points) : []];
    const series = [];
    groups.forEach((g, i) => {
      data.push((g.points || []).map((p) => p.avg));
      const name = Object.values(g.group).map((v) => (v === null ? '(none)' : v)).join(', ') || 'all';
      series.push({ label: `${name} (${g.sensors})`, stroke: palette[i % palette.length], width: 2 });
    });
    drawChart('group', container, data, series, []);
    container.dataset.state = 'ready';
    caption.textContent = `${groups.length} groups by ${state.groupBy}`;
  }

  async function openSensor(id) {
    state.sensor = id;
    $('sensor').hidden = false;
    $('sensor-title').textContent = id;
    $('sensor-error').textContent = '';
    $('sensor-labels').textContent = '';
    let info = null;
    try {
      const body = await api(`/api/v1/sensors?sensor=${enc(id)}&limit=1`);
      info = body.sensors.find((s) => s.sensor === id) || null;
    } catch (e) {
      if (e.status === 401) return;
    }
    state.info = info;
    const metrics = info && info.metrics.length ? info.metrics : ['value'];
    if (!metrics.includes(state.metric)) state.metric = metrics[0];
    $('metric').replaceChildren(...metrics.map((m) => el('option', { value: m, textContent: m, selected: m === state.metric })));
    const labels = info ? Object.entries(info.labels || {}) : [];
    $('sensor-labels').textContent = labels.length ? labels.map(([k, v]) => k + '=' + v).join(', ') : '';
    const keys = ['', 'sensor', ...labels.map(([k]) => 'label.' + k)];
    if (!keys.includes(state.groupBy)) state.groupBy = '';
    $('group-by').replaceChildren(...keys.map((k) => el('option', {
      value: k, textContent: k ? k.replace(/^label\./, '') : 'nothing', selected: k === state.groupBy,
    })));
    await loadChart();
    $('sensor-title').scrollIntoView({ block: 'nearest' });
  }

  async function downloadCsv() {
    if (!hg.urls.series) return;
    try {
      const r = await api(hg.urls.series + '&format=csv', true);
      const blob = await r.blob();
      const a = el('a', { href: URL.createObjectURL(blob), download: `${state.sensor}-${state.metric}.csv` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 60000);
    } catch (e) {
      $('sensor-error').textContent = 'The CSV could not be read: ' + e.message;
    }
  }

  // --- Health ------------------------------------------------------------------

  // Sums of each metric over its label sets, from the Prometheus text format.
  function parseMetrics(text) {
    const sums = new Map();
    for (const line of text.split('\n')) {
      if (!line || line[0] === '#') continue;
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const v = Number(m[3]);
      if (Number.isFinite(v)) sums.set(m[1], (sums.get(m[1]) || 0) + v);
    }
    return sums;
  }

  // hourglass_mqtt_route_messages_total: each route's count per outcome.
  function parseRoutes(text) {
    const routes = new Map();
    const re = /^hourglass_mqtt_route_messages_total\{([^}]*)\}\s+(\S+)/;
    for (const line of text.split('\n')) {
      const m = re.exec(line);
      if (!m) continue;
      const labels = {};
      for (const l of m[1].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
      if (!labels.route) continue;
      if (!routes.has(labels.route)) routes.set(labels.route, { stored: 0, ignored: 0, dead_lettered: 0 });
      routes.get(labels.route)[labels.outcome] = Number(m[2]);
    }
    return routes;
  }

  function showRoutes(routes) {
    $('routes-box').hidden = routes.size === 0;
    $('routes').tBodies[0].replaceChildren(...[...routes].map(([name, n]) => el('tr', {},
      el('th', { scope: 'row' }, name),
      el('td', {}, fmtNumber(n.stored)),
      el('td', {}, fmtNumber(n.ignored)),
      el('td', { class: n.dead_lettered > 0 ? 'bad' : '' }, fmtNumber(n.dead_lettered)))));
  }

  async function loadHealth() {
    try {
      const r = await fetch('/metrics');
      const now = Date.now();
      const text = await r.text();
      const m = parseMetrics(text);
      showRoutes(parseRoutes(text));
      const received = m.get('hourglass_readings_received_total') || 0;
      const prev = state.health;
      if (prev && now > prev.at) {
        $('stat-rate').textContent = fmtNumber(Math.max(0, (received - prev.received) / ((now - prev.at) / 1000)));
      }
      state.health = { at: now, received };
      $('stat-pending').textContent = fmtNumber(m.get('hourglass_pending_readings') || 0);
      $('stat-late').textContent = fmtNumber(m.get('hourglass_rollup_late_hours') || 0);
      $('stat-journal').textContent = m.has('hourglass_journal_bytes') ? fmtBytes(m.get('hourglass_journal_bytes')) : 'off';
      $('stat-lag').textContent = m.has('hourglass_journal_behind_seconds') ? fmtNumber(m.get('hourglass_journal_behind_seconds')) + ' s' : 'off';
    } catch (_) {
      $('stat-rate').textContent = 'unreachable';
    }
    try {
      const r = await fetch('/health/ready');
      const body = await r.json();
      const ready = $('stat-ready');
      const failing = Object.values(body.checks || {}).filter((c) => c && !c.ok).map((c) => c.reason);
      ready.textContent = body.ready ? 'yes' : 'no: ' + failing.join('; ');
      ready.className = body.ready ? 'good' : 'bad';
      // The readiness checks name MQTT only when the service subscribes.
      const mqtt = $('stat-mqtt');
      const check = (body.checks || {}).mqtt;
      mqtt.textContent = !check ? 'off' : check.ok ? 'connected' : 'disconnected';
      mqtt.className = !check ? '' : check.ok ? 'good' : 'bad';
    } catch (_) { /* shown as unreachable above */ }
    if (!signedIn()) return;
    try {
      const body = await api('/api/v1/dead_letters?limit=5');
      $('stat-dead').textContent = body.total === null ? fmtNumber(body.dead_letters.length) + '+' : fmtNumber(body.total);
      const list = $('dead-letters');
      list.replaceChildren(...body.dead_letters.map((d) => el('li', {},
        el('strong', {}, `${d.sensor} ${d.metric}`), ` ${fmtTime(d.bucket_start)}: ${d.readings} readings. ${d.reason} (${fmtTime(d.at)})`)));
      if (!body.dead_letters.length) list.replaceChildren(el('li', {}, 'None.'));
    } catch (_) { /* the fleet view shows why */ }
  }

  // --- Wiring ------------------------------------------------------------------

  function route() {
    const m = /^#sensor=(.+)$/.exec(location.hash);
    if (m) {
      openSensor(decodeURIComponent(m[1]));
    } else {
      $('sensor').hidden = true;
      state.sensor = null;
    }
  }

  function refreshAll() {
    loadHealth();
    // Without a token every API call would answer 401: ask first.
    if (!signedIn()) return;
    loadFleet();
    route();
  }

  function wire() {
    $('login-form').addEventListener('submit', (ev) => {
      const token = $('token').value.trim();
      if (!token) { ev.preventDefault(); return; }
      sessionStorage.setItem(TOKEN_KEY, token);
      $('token').value = '';
      $('signout').hidden = false;
      refreshAll();
    });
    $('signout').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
    $('fleet-filter').addEventListener('submit', (ev) => {
      ev.preventDefault();
      state.glob = $('glob').value.trim();
      const label = $('label-filter').value.trim();
      state.label = null;
      if (label) {
        const i = label.indexOf('=');
        if (i <= 0 || i === label.length - 1) {
          $('fleet-status').textContent = 'A label filter reads name=value.';
          return;
        }
        state.label = [label.slice(0, i).trim(), label.slice(i + 1).trim()];
      }
      state.pages = [null];
      state.page = 0;
      loadFleet();
    });
    $('prev').addEventListener('click', () => { if (state.page > 0) { state.page -= 1; loadFleet(); } });
    $('next').addEventListener('click', () => {
      if (!state.next) return;
      state.pages[state.page + 1] = state.next;
      state.page += 1;
      loadFleet();
    });
    document.querySelectorAll('[data-range]').forEach((b) => b.addEventListener('click', () => {
      document.querySelectorAll('[data-range]').forEach((x) => x.setAttribute('aria-pressed', String(x === b)));
      if (b.dataset.range === 'custom') {
        $('custom').hidden = false;
        $('from').focus();
        return;
      }
      $('custom').hidden = true;
      state.custom = null;
      state.range = Number(b.dataset.range);
      loadChart();
    }));
    $('custom').addEventListener('submit', (ev) => {
      ev.preventDefault();
      // datetime-local has no zone: read it in the chosen one.
      const from = zonedToEpoch($('from').value, state.tz);
      const to = zonedToEpoch($('to').value, state.tz);
      if (!(from < to)) {
        $('sensor-error').textContent = 'From must be before To.';
        return;
      }
      state.custom = { from, to };
      loadChart();
    });
    $('metric').addEventListener('change', () => { state.metric = $('metric').value; loadChart(); });
    $('tz').replaceChildren(...[...new Set([BROWSER_TZ, 'UTC'])].map((z) => el('option', {
      value: z, textContent: z === BROWSER_TZ ? `${z} (this browser)` : z,
    })));
    $('tz').addEventListener('change', () => { state.tz = $('tz').value; loadChart(); });
    $('weighting').addEventListener('change', () => { state.weighting = $('weighting').value; loadChart(); });
    $('group-by').addEventListener('change', () => {
      state.groupBy = $('group-by').value;
      const range = currentRange();
      loadGroupChart(chooseStep((range.to - range.from) / 1000, $('chart').clientWidth || 600), range);
    });
    $('csv').addEventListener('click', downloadCsv);
    $('home').addEventListener('click', (ev) => { ev.preventDefault(); location.hash = ''; });
    window.addEventListener('hashchange', route);
    let resize = null;
    window.addEventListener('resize', () => {
      clearTimeout(resize);
      resize = setTimeout(() => {
        for (const [key, chart] of Object.entries(hg.charts)) {
          const box = key === 'sensor' ? $('chart') : $('group-chart');
          chart.setSize({ width: Math.max(280, box.clientWidth), height: 300 });
        }
      }, 200);
    });
  }

  // Epoch ms of a wall-clock time ("2026-01-02T03:04") in `tz`.
  function zonedToEpoch(local, tz) {
    const guess = Date.parse(local + 'Z');
    if (!Number.isFinite(guess)) return NaN;
    const parts = new Intl.DateTimeFormat('en-US', {
      timeZone: tz, hourCycle: 'h23', year: 'numeric', month: '2-digit', day: '2-digit',
      hour: '2-digit', minute: '2-digit', second: '2-digit',
    }).formatToParts(new Date(guess));
    const p = Object.fromEntries(parts.map((x) => [x.type, x.value]));
    const shown = Date.UTC(+p.year, +p.month - 1, +p.day, +p.hour, +p.minute, +p.second);
    return guess - (shown - guess);
  }

  async function start() {
    wire();
    try {
      state.config = await (await fetch('console/config.json')).json();
    } catch (_) { /* assume no auth; a 401 asks */ }
    $('signout').hidden = !state.config.auth || !sessionStorage.getItem(TOKEN_KEY);
    if (!signedIn()) askToken('');
    refreshAll();
    setInterval(loadHealth, REFRESH_MS);
  }

  start();
})();
