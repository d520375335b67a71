// storc console: plain JavaScript, no library, no build step. Every action is a call to the same
// /api/v1 routes the CLI uses; the page polls them once a second. Text from the daemon (names,
// events, errors) is only ever set as textContent, never parsed as HTML.
'use strict';

(() => {
  const POLL_MS = 1000;
  const EVENTS_SHOWN = 100;
  /** How long a first click on "Delete VD" waits for the second. */
  const DELETE_ARM_MS = 5000;
  const STATE_NAMES = {
    Onln: 'online', GHS: 'global hot spare', DHS: 'dedicated hot spare', UGood: 'unconfigured good', Rbld: 'rebuilding',
    Cpybck: 'copyback', Offln: 'offline', Failed: 'failed', UBad: 'unconfigured bad', Msng: 'missing', Frgn: 'foreign', Jrnl: 'journal', Mgrt: 'receiving a migrating VD',
  };

  const $ = (id) => document.getElementById(id);

  /** What the daemon answered last; null before the first answer. */
  let latest = null;
  let pollTimer = null;
  let lastEventSequence = -1;
  let selectedSlot = null;

  class ApiFailure extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // ---------------------------------------------------------------------------------------------
  // The API

  async function api(method, path, body) {
    const init = { method, headers: { Accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new ApiFailure(0, `cannot reach the storc daemon (${error.message})`);
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const message = data && typeof data.error === 'string' ? data.error : `HTTP ${response.status} from ${method} ${path}`;
      if (response.status === 401) showLogin(message);
      throw new ApiFailure(response.status, message);
    }
    return data;
  }

  /** Runs one action, shows its outcome, and refreshes at once. */
  async function act(label, call) {
    try {
      await call();
      notice(`${label}: done`, false);
    } catch (error) {
      notice(`${label}: ${error.message}`, true);
    }
    await refresh();
  }

  function notice(text, isError) {
    $('notice-text').textContent = text;
    $('notice').classList.toggle('error', isError);
    $('notice').hidden = false;
  }

  // ---------------------------------------------------------------------------------------------
  // Login

  function showLogin(message) {
    stopPolling();
    $('console').hidden = true;
    $('logout-button').hidden = true;
    $('login').hidden = false;
    $('login-error').hidden = !message;
    $('login-error').textContent = message || '';
    $('login-token').focus();
  }

  function showConsole() {
    $('login').hidden = true;
    $('console').hidden = false;
    $('logout-button').hidden = false;
    startPolling();
  }

  async function login(event) {
    event.preventDefault();
    try {
      await api('POST', '/console/login', { token: $('login-token').value.trim() });
      $('login-token').value = '';
      showConsole();
    } catch (error) {
      $('login-error').hidden = false;
      $('login-error').textContent = error.message;
    }
  }

  async function logout() {
    try {
      await api('POST', '/console/logout');
    } finally {
      showLogin('Logged out.');
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Polling

  function startPolling() {
    stopPolling();
    const tick = async () => {
      await refresh();
      if (pollTimer !== null) pollTimer = setTimeout(tick, POLL_MS);
    };
    pollTimer = setTimeout(tick, 0);
  }

  function stopPolling() {
    if (pollTimer !== null) clearTimeout(pollTimer);
    pollTimer = null;
  }

  async function refresh() {
    let answers;
    try {
      answers = await Promise.all([
        api('GET', '/api/v1/controller'), api('GET', '/api/v1/rebuilds'), api('GET', '/api/v1/copybacks'),
        api('GET', '/api/v1/ccs'), api('GET', '/api/v1/bgis'), api('GET', '/api/v1/inits'),
        api('GET', '/api/v1/patrolread'), api('GET', '/api/v1/events'), api('GET', '/api/v1/iostats'),
        api('GET', '/api/v1/migrations'),
      ]);
    } catch (error) {
      if (error.status !== 401) $('last-update').textContent = `no answer: ${error.message}`;
      return;
    }
    const [controller, rebuilds, copybacks, ccs, bgis, inits, patrol, events, iostats, migrations] = answers;
    latest = { controller, rebuilds, copybacks, ccs, bgis, inits, patrol, migrations };
    render(latest, events, iostats);
    $('last-update').textContent = `updated ${new Date().toLocaleTimeString()}`;
  }

  function render(state, events, iostats) {
    renderSummary(state.controller);
    renderSlots(state.controller.drives);
    renderDriveControls(state.controller.drives);
    renderVds(state.controller.vds);
    renderVdControls(state.controller.vds);
    renderCreateDrives(state.controller.drives);
    renderOperations(state);
    renderEvents(events);
    window.StorcCharts.record(iostats);
    window.StorcCharts.render({ iops: $('chart-iops'), mbps: $('chart-mbps'), latencyUs: $('chart-latency'), legend: $('chart-legend') });
  }

  // ---------------------------------------------------------------------------------------------
  // Small DOM helpers

  /** An element with a class, text or attributes; children appended as nodes or text. */
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    if (props.class) node.className = props.class;
    if (props.text !== undefined) node.textContent = props.text;
    for (const [name, value] of Object.entries(props.data || {})) node.dataset[name] = value;
    for (const [name, value] of Object.entries(props.attrs || {})) node.setAttribute(name, value);
    for (const child of children) node.append(child);
    return node;
  }

  /** Redraws `container` only when `key` changed: unchanged parts keep their nodes (and a click on them lands). */
  function redraw(container, key, build) {
    if (container.dataset.key === key) return;
    container.replaceChildren(...build());
    container.dataset.key = key;
  }

  /** Replaces a select's options when they changed, keeping the chosen value if it is still there. */
  function setOptions(select, options) {
    const key = JSON.stringify(options);
    if (select.dataset.key === key) return;
    const chosen = select.value;
    select.replaceChildren(...options.map(([value, label]) => el('option', { text: label, attrs: { value } })));
    select.dataset.key = key;
    if (options.some(([value]) => value === chosen)) select.value = chosen;
  }

  function bytes(count) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let value = count;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return 'estimating…';
    if (seconds < 60) return `${seconds} s`;
    const minutes = Math.floor(seconds / 60);
    if (minutes < 60) return `${minutes} min ${seconds % 60} s`;
    return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
  }

  function utc(unixSecs) {
    return new Date(unixSecs * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, '');
  }

  function onOff(flag) {
    return flag ? 'on' : 'off';
  }

  // ---------------------------------------------------------------------------------------------
  // Summary, slots, VDs

  function renderSummary(c) {
    const badge = $('status-badge');
    badge.textContent = c.status;
    badge.className = `badge ${c.status === 'Optimal' ? 'optimal' : 'attention'}`;
    const rows = [
      ['Product', `${c.product} ${c.version}`], ['Status', c.status], ['Controller id', c.controller_id],
      ['Generation', String(c.generation)], ['VDs', String(c.vds.length)], ['Drives', String(c.drives.length)],
      ['Shards', String(c.shards)], ['Parity kernels', c.parity_kernels],
      ['Auto rebuild', onOff(c.auto_rebuild)], ['Rebuild rate', `${c.rebuild_rate_percent} %`], ['Copyback', onOff(c.copyback)],
      ['CC', `${c.cc_mode || 'off'}, rate ${c.cc_rate_percent} %`], ['Foreign configs', String(c.foreign_configurations)],
    ];
    $('summary-list').replaceChildren(...rows.flatMap(([name, value]) => [el('dt', { text: name }), el('dd', { text: value })]));
    $('summary-nbd').textContent = c.nbd_endpoints.length ? `NBD: ${c.nbd_endpoints.join('\n')}` : 'NBD: no VD exported';
    $('settings-rebuild-rate').placeholder = String(c.rebuild_rate_percent);
  }

  function renderSlots(drives) {
    redraw($('slot-map'), JSON.stringify(drives), () => drives.map((d) => {
      const detail = [bytes(d.size_bytes), d.vd !== null && d.vd !== undefined ? `v${d.vd}` : '', d.source].filter(Boolean).join(' · ');
      const tile = el('div', { class: `slot state-${d.state}`, data: { slot: String(d.slot), state: d.state }, attrs: { title: STATE_NAMES[d.state] || d.state } },
        el('span', { class: 'slot-number', text: `s${d.slot}` }), el('span', { class: 'slot-state', text: d.state }),
        el('div', { class: 'slot-detail', text: detail }));
      tile.classList.toggle('selected', d.slot === selectedSlot);
      tile.addEventListener('click', () => selectSlot(d.slot));
      return tile;
    }));
    const seen = [...new Set(drives.map((d) => d.state))];
    redraw($('slot-legend'), seen.join(), () => seen.map((s) => el('span', {}, el('span', { class: `swatch state-${s}` }), `${s}: ${STATE_NAMES[s] || s}`)));
  }

  function selectSlot(slot) {
    selectedSlot = slot;
    $('drive-select').value = String(slot);
    for (const tile of document.querySelectorAll('.slot')) tile.classList.toggle('selected', tile.dataset.slot === String(slot));
  }

  function renderDriveControls(drives) {
    const options = drives.map((d) => [String(d.slot), `s${d.slot} (${d.state})`]);
    setOptions($('drive-select'), options);
    if (selectedSlot === null && drives.length) selectedSlot = drives[0].slot;
    if (selectedSlot !== null) $('drive-select').value = String(selectedSlot);
    setOptions($('copyback-target'), drives.map((d) => [String(d.slot), `s${d.slot} (${d.state})`]));
  }

  function renderVds(vds) {
    const rows = vds.map((v) => {
      const members = v.member_slots.map((slot, i) => `${slot}:${v.member_states[i]}`).join(' ');
      const policy = v.write_policy === v.write_policy_effective ? v.write_policy : `${v.write_policy} (runs ${v.write_policy_effective})`;
      return [v.vd, v.name, v.level, bytes(v.size_bytes), v.state, members, policy, v.read_policy, v.io_policy, v.consistent ? 'yes' : 'no'];
    });
    const classes = ['', 'vd-name', 'vd-level', 'vd-size', 'vd-state', 'vd-members', 'vd-write-policy', 'vd-read-policy', 'vd-io-policy', 'vd-consistent'];
    redraw($('vd-table').tBodies[0], JSON.stringify(rows), () => {
      if (!rows.length) return [el('tr', {}, el('td', { text: 'No virtual drive yet.', attrs: { colspan: '10' } }))];
      return rows.map(([vd, ...cells]) => el('tr', { data: { vd: String(vd) } }, el('td', { text: `v${vd}` }),
        ...cells.map((text, i) => el('td', { text, class: i === 3 ? `vd-state vd-state-${text}` : classes[i + 1] }))));
    });
  }

  function renderVdControls(vds) {
    setOptions($('vd-select'), vds.map((v) => [String(v.vd), `v${v.vd} ${v.name} (${v.level})`]));
  }

  function renderCreateDrives(drives) {
    const free = drives.filter((d) => d.state === 'UGood');
    const box = $('create-drives');
    const key = free.map((d) => d.slot).join(',');
    if (box.dataset.key === key) return;
    const checked = new Set([...box.querySelectorAll('input:checked')].map((input) => input.value));
    const boxes = free.map((d) => {
      const input = el('input', { attrs: { type: 'checkbox', name: 'create-drive', value: String(d.slot) } });
      input.checked = checked.has(String(d.slot));
      return el('label', { class: 'drive-choice' }, input, `s${d.slot}`);
    });
    box.replaceChildren(...(boxes.length ? boxes : [el('span', { class: 'subtle', text: 'no unconfigured good drive' })]));
    box.dataset.key = key;
  }

  // ---------------------------------------------------------------------------------------------
  // Background operations

  function progressBar(kind, target, percent) {
    const shown = Math.max(0, Math.min(100, percent));
    const bar = el('div', { class: 'bar' });
    bar.style.width = `${shown}%`;
    return el('div', { class: 'progress', data: { kind, target, percent: String(percent) } }, bar, el('span', { class: 'label', text: `${percent.toFixed(1)} %` }));
  }

  function operationRows(state) {
    const rows = [];
    for (const r of state.rebuilds) rows.push(['Rebuild', 'rebuild', `s${r.slot}`, `slot ${r.slot} (v${r.vd})`, r.progress_percent, r.status, r.estimated_seconds_left]);
    for (const c of state.copybacks) {
      rows.push(['Copyback', 'copyback', `s${c.slot}`, `slot ${c.source_slot} → ${c.slot} (v${c.vd})`, c.progress_percent, c.status, c.estimated_seconds_left]);
    }
    for (const m of state.migrations) {
      rows.push(['Migration', 'migrate', `v${m.vd}`, `v${m.vd} → slot ${m.target_slot} (${m.target_source})`, m.progress_percent, m.status, m.estimated_seconds_left]);
    }
    for (const c of state.ccs) {
      const found = `${c.status}; ${c.rows_inconsistent} inconsistent row(s)${c.repair ? `, ${c.rows_repaired} repaired` : ''}`;
      rows.push(['Consistency check', 'cc', `v${c.vd}`, `v${c.vd}`, c.progress_percent, found, c.estimated_seconds_left]);
    }
    for (const b of state.bgis) rows.push(['Background init', 'bgi', `v${b.vd}`, `v${b.vd}`, b.progress_percent, b.status, b.estimated_seconds_left]);
    for (const i of state.inits) rows.push(['Full init', 'init', `v${i.vd}`, `v${i.vd}`, i.progress_percent, `running ${i.elapsed_seconds} s`, null]);
    for (const v of state.controller.vds) {
      if (v.resync && v.resync.percent_done !== null && v.resync.percent_done !== undefined) {
        rows.push(['Resync', 'resync', `v${v.vd}`, `v${v.vd}`, v.resync.percent_done, v.resync.status, null]);
      }
    }
    const p = state.patrol;
    if (p.state !== 'Stopped' && p.progress_percent !== null && p.progress_percent !== undefined) {
      const on = p.current_slot !== null && p.current_slot !== undefined ? `slot ${p.current_slot}` : 'drives';
      rows.push(['Patrol read', 'patrol', 'controller', `${on} (${p.drives_done}/${p.drives_total} done)`, p.progress_percent, p.state, null]);
    }
    return rows;
  }

  function renderOperations(state) {
    const rows = operationRows(state).map(([name, kind, target, on, percent, status, left]) =>
      el('tr', { data: { kind, target } }, el('td', { text: name }), el('td', { text: on }), el('td', {}, progressBar(kind, target, percent)),
        el('td', { text: status, class: 'op-status' }), el('td', { text: status === 'In progress' ? duration(left) : '–', class: 'op-left' })));
    if (!rows.length) rows.push(el('tr', {}, el('td', { text: 'None running.', attrs: { colspan: '5' } })));
    $('op-table').tBodies[0].replaceChildren(...rows);
    const p = state.patrol;
    $('patrol-summary').textContent = `(${p.enabled ? p.mode : 'off'}; ${p.state.toLowerCase()}; ${p.medium_errors} medium error(s), ${p.corrected} corrected)`;
  }

  function renderEvents(events) {
    const newest = events.length ? events[events.length - 1].sequence : -1;
    if (newest === lastEventSequence) return;
    lastEventSequence = newest;
    const shown = events.slice(-EVENTS_SHOWN).reverse();
    $('event-table').tBodies[0].replaceChildren(...shown.map((e) => el('tr', { class: `sev-${e.severity}` },
      el('td', { text: String(e.sequence) }), el('td', { text: utc(e.time_unix_secs) }), el('td', { text: e.severity }), el('td', { text: e.description }))));
  }

  // ---------------------------------------------------------------------------------------------
  // Actions

  function slotOrThrow() {
    const slot = Number.parseInt($('drive-select').value, 10);
    if (Number.isNaN(slot)) throw new Error('choose a slot first');
    return slot;
  }

  function vdOrThrow() {
    const vd = Number.parseInt($('vd-select').value, 10);
    if (Number.isNaN(vd)) throw new Error('there is no VD to act on');
    return vd;
  }

  function driveGroups(text) {
    const parts = text.split(',').map((part) => part.trim()).filter(Boolean);
    if (!parts.length || parts.some((part) => !/^\d+$/.test(part))) {
      throw new Error(`drive groups "${text}": give drive group numbers separated by commas, e.g. 0,1`);
    }
    return parts.map((part) => Number.parseInt(part, 10));
  }

  function wireDriveActions() {
    $('drive-select').addEventListener('change', () => selectSlot(Number.parseInt($('drive-select').value, 10)));
    for (const button of document.querySelectorAll('[data-drive-state]')) {
      const state = button.dataset.driveState;
      button.addEventListener('click', () => act(`set slot ${$('drive-select').value} ${state}`, () => api('POST', `/api/v1/drives/${slotOrThrow()}/state`, { state })));
    }
    $('drive-hotspare-global').addEventListener('click', () =>
      act(`slot ${$('drive-select').value} as global hot spare`, () => api('POST', `/api/v1/drives/${slotOrThrow()}/hotspare`, { drive_groups: [] })));
    $('drive-hotspare-dedicated').addEventListener('click', () =>
      act(`slot ${$('drive-select').value} as dedicated hot spare`, () =>
        api('POST', `/api/v1/drives/${slotOrThrow()}/hotspare`, { drive_groups: driveGroups($('drive-hotspare-dgs').value) })));
    $('drive-hotspare-remove').addEventListener('click', () =>
      act(`remove hot spare slot ${$('drive-select').value}`, () => api('DELETE', `/api/v1/drives/${slotOrThrow()}/hotspare`)));
    for (const button of document.querySelectorAll('[data-rebuild]')) {
      const action = button.dataset.rebuild;
      button.addEventListener('click', () => act(`${action} rebuild of slot ${$('drive-select').value}`, () =>
        api('POST', `/api/v1/drives/${slotOrThrow()}/rebuild`, { action })));
    }
    for (const button of document.querySelectorAll('[data-copyback]')) {
      const action = button.dataset.copyback;
      button.addEventListener('click', () => act(`${action} copyback of slot ${$('drive-select').value}`, () => {
        const body = { action };
        if (action === 'start') body.target = Number.parseInt($('copyback-target').value, 10);
        return api('POST', `/api/v1/drives/${slotOrThrow()}/copyback`, body);
      }));
    }
  }

  function wireVdActions() {
    $('vd-apply-policies').addEventListener('click', () => act(`policies of v${$('vd-select').value}`, () => {
      const body = {};
      for (const [field, id] of [['write_policy', 'vd-write-policy'], ['read_policy', 'vd-read-policy'], ['io_policy', 'vd-io-policy'], ['seq_cutoff', 'vd-seq-cutoff']]) {
        if ($(id).value.trim()) body[field] = $(id).value.trim();
      }
      if (!Object.keys(body).length) throw new Error('choose a write, read or IO policy or a sequential cutoff to change');
      return api('PATCH', `/api/v1/vds/${vdOrThrow()}`, body);
    }));
    for (const button of document.querySelectorAll('[data-cc]')) {
      const action = button.dataset.cc;
      button.addEventListener('click', () => act(`${action} consistency check of v${$('vd-select').value}`, () =>
        api('POST', `/api/v1/vds/${vdOrThrow()}/cc`, { action })));
    }
    const remove = $('vd-delete');
    remove.addEventListener('click', () => {
      // Two clicks: the first arms the button for a few seconds, the second deletes.
      if (!remove.classList.contains('armed')) {
        remove.classList.add('armed');
        remove.textContent = `Click again to delete v${$('vd-select').value}`;
        setTimeout(() => disarm(remove), DELETE_ARM_MS);
        return;
      }
      disarm(remove);
      const force = $('vd-delete-force').checked;
      act(`delete v${$('vd-select').value}`, () => api('DELETE', `/api/v1/vds/${vdOrThrow()}${force ? '?force=true' : ''}`));
    });
  }

  function disarm(button) {
    button.classList.remove('armed');
    button.textContent = 'Delete VD';
  }

  function wireCreate() {
    $('create-form').addEventListener('submit', (event) => {
      event.preventDefault();
      act('create VD', () => {
        const drives = [...document.querySelectorAll('input[name="create-drive"]:checked')].map((input) => Number.parseInt(input.value, 10));
        if (!drives.length) throw new Error('choose the drives of the new VD (unconfigured good drives)');
        const body = {
          level: $('create-level').value, drives, strip_kib: Number.parseInt($('create-strip').value, 10),
          write_policy: $('create-write-policy').value, read_policy: $('create-read-policy').value, io_policy: $('create-io-policy').value,
        };
        if ($('create-name').value.trim()) body.name = $('create-name').value.trim();
        if ($('create-pdperarray').value) body.pdperarray = Number.parseInt($('create-pdperarray').value, 10);
        return api('POST', '/api/v1/vds', body).then(() => {
          $('create-name').value = '';
          for (const input of document.querySelectorAll('input[name="create-drive"]')) input.checked = false;
        });
      });
    });
  }

  function wireSettingsAndPatrol() {
    $('settings-form').addEventListener('submit', (event) => {
      event.preventDefault();
      act('controller settings', () => {
        const body = {};
        const rate = $('settings-rebuild-rate').value.trim();
        if (rate) {
          if (!/^\d+$/.test(rate) || Number(rate) > 100) throw new Error(`rebuild rate "${rate}": give 0 to 100`);
          body.rebuild_rate_percent = Number(rate);
        }
        if ($('settings-auto-rebuild').value) body.auto_rebuild = $('settings-auto-rebuild').value === 'true';
        if ($('settings-copyback').value) body.copyback = $('settings-copyback').value === 'true';
        if (!Object.keys(body).length) throw new Error('change a setting first');
        return api('PATCH', '/api/v1/controller', body).then(() => { $('settings-rebuild-rate').value = ''; });
      });
    });
    for (const button of document.querySelectorAll('[data-patrol]')) {
      const action = button.dataset.patrol;
      button.addEventListener('click', () => act(`${action} patrol read`, () => api('POST', '/api/v1/patrolread', { action })));
    }
  }

  async function start() {
    $('login-form').addEventListener('submit', login);
    $('logout-button').addEventListener('click', logout);
    $('notice-close').addEventListener('click', () => { $('notice').hidden = true; });
    wireDriveActions();
    wireVdActions();
    wireCreate();
    wireSettingsAndPatrol();
    try {
      await api('GET', '/api/v1/controller');
      showConsole();
    } catch (error) {
      if (error.status !== 401) showLogin(error.message);
    }
  }

  document.addEventListener('DOMContentLoaded', start);
})();
