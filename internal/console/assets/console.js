// SPDX-License-Identifier: Apache-2.0
// The idemsvc console: plain DOM, no framework. Everything shown is set with
// textContent (never innerHTML), so a stored body stays text. The API key
// lives in sessionStorage only and goes out as a bearer token; the URL (its
// hash) holds the filters and the record's tenant and key, never the key.

const KEY = 'idemsvc.apiKey';
const BODY_SHOWN = 64 * 1024; // bytes of a body shown; the rest is in the download
const AUTO_MS = 5000;

const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
};

let tenants = []; // the usage of the tenants the key may see
let cursors = ['']; // the cursors of the pages walked, for the pager
let autoTimer = 0; // the next automatic refresh, armed after the last one ended
let view = 0; // the render's generation: an answer for an older one is dropped
let keysLoad = 0; // the newest listing asked for: an older answer is dropped
let bodyBytes = null; // the record's body (its first BODY_SHOWN bytes when fetched by reference)
let bodySize = 0; // the whole body's length
let bodyRef = null; // {tenant, key} of a body kept by reference, fetched from GET /v1/keys/body
let downloadURL = '';

// --- the API -----------------------------------------------------------

class Problem extends Error {
  constructor(status, body) {
    super(body && (body.detail || body.title) ? `${body.title || 'Error'}: ${body.detail || ''}` : `HTTP ${status}`);
    this.status = status;
  }
}

function call(method, path, params, accept) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== '') q.set(k, v);
  const headers = { Accept: accept };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const qs = q.toString();
  return fetch(qs ? `${path}?${qs}` : path, { method, headers, credentials: 'omit', cache: 'no-store' });
}

async function api(method, path, params) {
  const res = await call(method, path, params, 'application/json');
  if (res.status === 204) return null;
  const body = await res.json().catch(() => null);
  if (!res.ok) throw new Problem(res.status, body);
  return body;
}

// storedBody fetches a record's stored body from GET /v1/keys/body: its
// first limit bytes (the rest is not read), or all of it without limit.
async function storedBody(tenant, key, limit) {
  const res = await call('GET', '/v1/keys/body', { tenant, key }, 'application/octet-stream');
  if (!res.ok) throw new Problem(res.status, await res.json().catch(() => null));
  if (limit === undefined) return new Uint8Array(await res.arrayBuffer());
  const out = new Uint8Array(limit);
  let n = 0;
  const reader = res.body.getReader();
  while (n < limit) {
    const { done, value } = await reader.read();
    if (done) break;
    const take = Math.min(value.length, limit - n);
    out.set(value.subarray(0, take), n);
    n += take;
  }
  reader.cancel().catch(() => {});
  return out.subarray(0, n);
}

// --- messages ----------------------------------------------------------

function showError(err) {
  if (err instanceof Problem && err.status === 401) {
    sessionStorage.removeItem(KEY);
    location.hash = '#/signin';
  }
  const e = $('error');
  e.textContent = err.message || String(err);
  e.hidden = false;
}

function notice(text) {
  const n = $('notice');
  n.textContent = text;
  n.hidden = !text;
}

function clearMessages() {
  $('error').hidden = true;
  notice('');
}

// --- routing -----------------------------------------------------------

function route() {
  const [path, query] = location.hash.slice(1).split('?');
  return { path: path || '/keys', params: new URLSearchParams(query || '') };
}

function go(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, v);
  location.hash = `#${path}${q.toString() ? `?${q}` : ''}`;
}

function showSection(id) {
  for (const s of ['signin', 'keys', 'record', 'tenants']) $(s).hidden = s !== id;
  $('nav').hidden = id === 'signin';
  $('nav-keys').toggleAttribute('aria-current', id === 'keys' || id === 'record');
  $('nav-tenants').toggleAttribute('aria-current', id === 'tenants');
  if ($('nav-keys').hasAttribute('aria-current')) $('nav-keys').setAttribute('aria-current', 'page');
  if ($('nav-tenants').hasAttribute('aria-current')) $('nav-tenants').setAttribute('aria-current', 'page');
}

async function render() {
  const mine = ++view;
  clearTimeout(autoTimer);
  autoTimer = 0;
  const { path, params } = route();
  if (sessionStorage.getItem(KEY) === null || path === '/signin') {
    showSection('signin');
    $('apikey').focus();
    return;
  }
  try {
    if (!tenants.length) await loadTenants();
    if (mine !== view) return;
    if (path === '/record') await showRecord(params, mine);
    else if (path === '/tenants') await showTenants(mine);
    else await showKeys(params, mine);
  } catch (err) {
    if (mine === view) showError(err);
  }
}

// --- sign in -----------------------------------------------------------

$('signin-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  clearMessages();
  sessionStorage.setItem(KEY, $('apikey').value);
  $('apikey').value = '';
  tenants = [];
  try {
    await loadTenants();
    // From a shared link, show what it names; its hash does not change.
    if (route().path === '/signin') go('/keys', {});
    else render();
  } catch (err) {
    sessionStorage.removeItem(KEY);
    showError(err);
  }
});

$('signout').addEventListener('click', () => {
  sessionStorage.removeItem(KEY);
  tenants = [];
  clearMessages();
  go('/signin', {});
});

async function loadTenants() {
  const usage = await api('GET', '/v1/usage');
  tenants = usage.tenants;
  const who = tenants.length === 1 ? `tenant ${tenants[0].tenant}` : `admin: ${tenants.length} tenants`;
  $('who').textContent = who;
  const sel = $('f-tenant');
  sel.replaceChildren(...tenants.map((t) => el('option', t.tenant)));
  sel.disabled = tenants.length < 2;
}

// --- keys --------------------------------------------------------------

function filters(params) {
  return {
    tenant: params.get('tenant') || (tenants[0] && tenants[0].tenant) || '',
    state: params.get('state') || 'in_progress',
    older_than_s: params.get('older_than_s') || '',
    limit: params.get('limit') || '100',
  };
}

async function showKeys(params, mine) {
  showSection('keys');
  const f = filters(params);
  $('f-tenant').value = f.tenant;
  $('f-state').value = f.state;
  $('f-older').value = f.older_than_s;
  $('f-limit').value = f.limit;
  cursors = [params.get('cursor') || ''];
  $('key-rows').replaceChildren();
  $('key-caption').textContent = '';
  await loadKeys();
  armAuto(mine);
}

// armAuto arms the next automatic refresh of the keys of render mine, if
// asked for: once the last load ended, so that loads never stack.
function armAuto(mine) {
  clearTimeout(autoTimer);
  autoTimer = 0;
  if (!$('auto').checked || mine !== view) return;
  autoTimer = setTimeout(async () => {
    try {
      await loadKeys();
    } catch (err) {
      showError(err);
    }
    armAuto(mine);
  }, AUTO_MS);
}

function current() {
  return filters(route().params);
}

// loadKeys lists the keys of the filters in the URL; an answer (or error)
// that a newer load or render has overtaken is dropped.
async function loadKeys() {
  const mine = view;
  const load = ++keysLoad;
  const f = current();
  const cursor = cursors[cursors.length - 1];
  const t0 = performance.now();
  let page;
  try {
    page = await api('GET', '/v1/keys', { ...f, cursor });
  } catch (err) {
    if (load === keysLoad && mine === view) throw err;
    return;
  }
  if (load !== keysLoad || mine !== view) return;
  const t1 = performance.now();
  const rows = document.createDocumentFragment();
  for (const rec of page.items) rows.append(keyRow(f.tenant, rec));
  $('key-rows').replaceChildren(rows);
  const table = $('key-table');
  table.dataset.count = String(page.items.length);
  table.dataset.renderMs = (performance.now() - t1).toFixed(1);
  table.dataset.loadMs = (performance.now() - t0).toFixed(1);
  $('key-caption').textContent = `${page.items.length} ${f.state.replace('_', ' ')} record(s) of tenant ${f.tenant}` +
    (f.older_than_s ? `, unchanged for ${f.older_than_s} s or more` : '') + `, page ${cursors.length}` +
    ` (as of ${new Date().toLocaleTimeString()})`;
  const next = $('next-page');
  next.disabled = !page.next_cursor;
  next.dataset.cursor = page.next_cursor || '';
  $('first-page').disabled = cursors.length === 1;
}

function recordLink(tenant, key) {
  const q = new URLSearchParams({ tenant, key });
  return `#/record?${q}`;
}

function keyRow(tenant, rec) {
  const tr = document.createElement('tr');
  const keyCell = el('td', undefined, 'key');
  const a = el('a', rec.key);
  a.href = recordLink(tenant, rec.key);
  keyCell.append(a);
  tr.append(keyCell, el('td', rec.state), el('td', rec.attempt), el('td', rec.owner || ''), el('td', rec.updated_at));
  const lease = el('td', rec.lease_expires_at || '');
  if (rec.lease_expired) {
    lease.append(el('span', ' (expired)', 'expired'));
  }
  const act = el('td');
  const free = el('button', 'Free');
  free.type = 'button';
  free.setAttribute('aria-label', `Free key ${rec.key}`);
  free.addEventListener('click', () => confirmFree(tenant, rec.key, () => loadKeys()));
  act.append(free);
  tr.append(lease, act);
  return tr;
}

$('filters').addEventListener('submit', (ev) => {
  ev.preventDefault();
  clearMessages();
  go('/keys', {
    tenant: $('f-tenant').value,
    state: $('f-state').value,
    older_than_s: $('f-older').value,
    limit: $('f-limit').value,
  });
});

$('refresh').addEventListener('click', () => {
  clearMessages();
  loadKeys().catch(showError);
});

$('auto').addEventListener('change', () => armAuto(view));

$('next-page').addEventListener('click', () => {
  cursors.push($('next-page').dataset.cursor);
  loadKeys().catch(showError);
});

$('first-page').addEventListener('click', () => {
  cursors = [''];
  loadKeys().catch(showError);
});

// --- free --------------------------------------------------------------

function confirmFree(tenant, key, after) {
  const dialog = $('confirm');
  $('confirm-text').textContent = `Free key "${key}" of tenant "${tenant}"? Its record is deleted: the next begin runs the operation again.`;
  dialog.returnValue = '';
  dialog.onclose = async () => {
    if (dialog.returnValue !== 'free') return;
    try {
      await api('DELETE', '/v1/keys', { tenant, key });
      notice(`Freed key "${key}" of tenant "${tenant}".`);
      await after();
    } catch (err) {
      showError(err);
    }
  };
  dialog.showModal();
  $('confirm-cancel').focus();
}

// --- a record ----------------------------------------------------------

function field(dl, name, value) {
  if (value === undefined || value === null || value === '') return;
  dl.append(el('dt', name), el('dd', value));
}

async function showRecord(params, mine = view) {
  showSection('record');
  const tenant = params.get('tenant') || '';
  const key = params.get('key') || '';
  $('back').href = `#/keys?${new URLSearchParams({ tenant })}`;
  const rec = await api('GET', '/v1/status', { tenant, key, include_response: 'true' });
  if (mine !== view) return;
  const dl = $('record-fields');
  dl.replaceChildren();
  field(dl, 'Key', rec.key);
  field(dl, 'Tenant', rec.tenant);
  field(dl, 'State', rec.state);
  field(dl, 'Attempt', rec.attempt);
  field(dl, 'Lease until', rec.lease_expires_at && `${rec.lease_expires_at}${rec.lease_expired ? ' (expired)' : ''}`);
  field(dl, 'Owner', rec.owner);
  field(dl, 'Fingerprint', rec.fingerprint);
  field(dl, 'Created', rec.created_at);
  field(dl, 'Updated', rec.updated_at);
  field(dl, 'Retained until', rec.expires_at);
  field(dl, 'Retryable', rec.retryable === undefined ? undefined : String(rec.retryable));
  field(dl, 'Error', rec.error);
  $('free').onclick = () => confirmFree(rec.tenant, rec.key, async () => go('/keys', { tenant: rec.tenant }));
  await showResponse(rec, mine);
}

function decodeBody(resp) {
  const body = resp.body || '';
  if (resp.body_encoding === 'base64') {
    const bin = atob(body);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  }
  return new TextEncoder().encode(body);
}

async function showResponse(rec, mine) {
  const resp = rec.response;
  $('response').hidden = !resp;
  if (downloadURL) URL.revokeObjectURL(downloadURL);
  downloadURL = '';
  bodyRef = null;
  if (!resp) return;
  const dl = $('response-fields');
  dl.replaceChildren();
  field(dl, 'Status', resp.status_code);
  field(dl, 'Body encoding', resp.body_encoding || 'text');
  const headers = Object.entries(resp.headers || {});
  $('header-rows').replaceChildren(...headers.map(([n, v]) => {
    const tr = el('tr');
    tr.append(el('td', n, 'key'), el('td', v, 'key'));
    return tr;
  }));
  const type = headers.find(([n]) => n.toLowerCase() === 'content-type');
  const download = $('download');
  if (resp.body_ref) {
    // A body kept by reference (over the JSON answers' limit): its first
    // bytes are shown, and the download fetches it whole when asked.
    field(dl, 'Body SHA-256', resp.body_ref.sha256);
    bodySize = resp.body_ref.size_bytes;
    bodyBytes = new Uint8Array(0);
    download.href = `/v1/keys/body?${new URLSearchParams({ tenant: rec.tenant, key: rec.key })}`;
    download.textContent = `Download the body (${bodySize} bytes)`;
    const bytes = await storedBody(rec.tenant, rec.key, BODY_SHOWN);
    if (mine !== view) return;
    bodyRef = { tenant: rec.tenant, key: rec.key };
    bodyBytes = bytes;
  } else {
    bodyBytes = decodeBody(resp);
    bodySize = bodyBytes.length;
    downloadURL = URL.createObjectURL(new Blob([bodyBytes], { type: 'application/octet-stream' }));
    download.href = downloadURL;
    download.textContent = `Download the body (${bodySize} bytes)`;
  }
  let as = 'text';
  const text = utf8(bodyBytes, bodySize > bodyBytes.length);
  if (text === null) as = 'hex';
  else if ((type && /json/i.test(type[1])) || isJSON(text)) as = 'json';
  $('body-view').value = as;
  showBody();
}

// utf8 decodes bytes as UTF-8, or returns null for bytes that are not; a
// body cut short may end in part of a character, which is left out.
function utf8(bytes, cut) {
  for (let drop = 0; drop <= (cut ? 3 : 0) && drop < bytes.length; drop++) {
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(0, bytes.length - drop));
    } catch {
      // try again without the last bytes, if the body was cut
    }
  }
  return bytes.length === 0 ? '' : null;
}

function isJSON(text) {
  const t = text.trim();
  if (!t.startsWith('{') && !t.startsWith('[')) return false;
  try {
    JSON.parse(t);
    return true;
  } catch {
    return false;
  }
}

function hex(bytes) {
  const lines = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const row = Array.from(bytes.subarray(i, i + 16), (b) => b.toString(16).padStart(2, '0')).join(' ');
    const ascii = Array.from(bytes.subarray(i, i + 16), (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : '.')).join('');
    lines.push(`${i.toString(16).padStart(8, '0')}  ${row.padEnd(47)}  ${ascii}`);
  }
  return lines.join('\n');
}

function showBody() {
  const shown = bodyBytes.subarray(0, BODY_SHOWN);
  const cut = $('body-cut');
  cut.hidden = bodySize <= BODY_SHOWN;
  cut.textContent = `The body is ${bodySize} bytes: the first ${BODY_SHOWN} are shown; download it for the rest.`;
  let out;
  switch ($('body-view').value) {
    case 'hex':
      out = hex(shown);
      break;
    case 'json': {
      const text = utf8(bodyBytes, bodySize > bodyBytes.length);
      if (text === null) { // not UTF-8: binary, shown in hex
        out = hex(shown);
        break;
      }
      try {
        out = JSON.stringify(JSON.parse(text), null, 2).slice(0, BODY_SHOWN);
      } catch {
        out = new TextDecoder().decode(shown);
      }
      break;
    }
    default: // a character cut at the end of what is shown is left out
      out = utf8(shown, bodySize > shown.length) ?? new TextDecoder().decode(shown);
  }
  $('body').textContent = out;
}

$('body-view').addEventListener('change', showBody);

// A body kept by reference is fetched whole when its download is asked
// for, then saved from memory as an inline body is.
$('download').addEventListener('click', async (ev) => {
  if (!bodyRef || downloadURL) return; // the body is in memory: the link saves it
  ev.preventDefault();
  const ref = bodyRef;
  const link = ev.currentTarget;
  try {
    notice('Fetching the body…');
    const bytes = await storedBody(ref.tenant, ref.key);
    if (ref !== bodyRef) return;
    downloadURL = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
    link.href = downloadURL;
    notice('');
    link.click();
  } catch (err) {
    showError(err);
  }
});

// --- tenants -----------------------------------------------------------

function ofLimit(used, limit) {
  const td = el('td', limit === undefined ? String(used) : `${used} / ${limit}`);
  if (limit !== undefined) {
    const m = el('meter');
    m.min = 0;
    m.max = limit;
    m.high = limit * 0.8;
    m.value = Math.min(used, limit);
    m.setAttribute('aria-label', `${used} of ${limit}`);
    td.append(el('br'), m);
  }
  return td;
}

async function showTenants(mine = view) {
  showSection('tenants');
  await loadTenants();
  if (mine !== view) return;
  $('tenant-rows').replaceChildren(...tenants.map((u) => {
    const tr = el('tr');
    const l = u.limits || {};
    const rate = l.begins_per_s === undefined ? u.begins_per_s.toFixed(2) : `${u.begins_per_s.toFixed(2)} / ${l.begins_per_s} (burst ${l.burst})`;
    const rej = Object.entries(u.rejections).filter(([, n]) => n > 0).map(([k, n]) => `${k}: ${n}`).join(', ') || 'none';
    const store = u.store_unavailable
      ? [el('td', 'unavailable'), el('td', 'unavailable'), el('td', 'unavailable')]
      : [ofLimit(u.stored_bytes, l.stored_bytes), ofLimit(u.waiters, l.waiters), ofLimit(u.in_progress, l.in_progress)];
    tr.append(el('td', u.tenant), el('td', rate), ...store, el('td', rej));
    return tr;
  }));
}

$('tenants-refresh').addEventListener('click', () => {
  clearMessages();
  showTenants().catch(showError);
});

window.addEventListener('hashchange', render);
render();
