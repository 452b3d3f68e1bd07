// SPDX-License-Identifier: Apache-2.0

// The top of a node --cpu-prof profile, as make load-sdk's PROFILE=1
// prints it:
//
//   node cpuprofile-top.mjs FILE.cpuprofile [N]
//
// The N (default 30) functions with the most self time, with their share
// of the samples, then the share of each source (file, or Node's own code,
// or the garbage collector).
import { readFileSync } from 'node:fs';

const [file, n = '30'] = process.argv.slice(2);
const profile = JSON.parse(readFileSync(file, 'utf8'));
const byId = new Map(profile.nodes.map((node) => [node.id, node]));
const samples = new Map();
for (const id of profile.samples) samples.set(id, (samples.get(id) ?? 0) + 1);
const total = profile.samples.length;

const fns = new Map();
const sources = new Map();
for (const [id, count] of samples) {
  const { functionName, url, lineNumber } = byId.get(id).callFrame;
  const where = url.replace(/^file:\/\//, '').replace(/^.*\/node_modules\//, '') || '(node)';
  const fn = `${functionName || '(anonymous)'} ${where}:${lineNumber + 1}`;
  fns.set(fn, (fns.get(fn) ?? 0) + count);
  const source = url === '' ? functionName.startsWith('(') ? functionName : '(native)' : url.startsWith('node:') ? 'node:' + url.slice(5).split('/')[0] : where.split('/').slice(0, where.startsWith('@') ? 2 : 1).join('/') === where ? where : where.replace(/\/(dist|lib|src)\/.*$/, '');
  sources.set(source, (sources.get(source) ?? 0) + count);
}
const pct = (c) => `${((100 * c) / total).toFixed(1).padStart(5)}%`;
console.log(`${total} samples; self time by function:`);
for (const [fn, c] of [...fns].sort((a, b) => b[1] - a[1]).slice(0, Number(n))) console.log(`  ${pct(c)}  ${fn}`);
console.log('self time by source:');
for (const [source, c] of [...sources].sort((a, b) => b[1] - a[1]).slice(0, 20)) console.log(`  ${pct(c)}  ${source}`);

// Total (inclusive) time of the functions of FILTER (a part of their
// source's path), when given: what each costs with what it calls.
const filter = process.argv[4];
if (filter) {
  const parent = new Map();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  const totals = new Map();
  for (const [id, count] of samples) {
    const seen = new Set();
    for (let at = id; at !== undefined; at = parent.get(at)) {
      const { functionName, url, lineNumber } = byId.get(at).callFrame;
      if (!url.includes(filter)) continue;
      const fn = `${functionName || '(anonymous)'} ${url.split('/').pop()}:${lineNumber + 1}`;
      if (seen.has(fn)) continue;
      seen.add(fn);
      totals.set(fn, (totals.get(fn) ?? 0) + count);
    }
  }
  console.log(`total time by function of ${filter}:`);
  for (const [fn, c] of [...totals].sort((a, b) => b[1] - a[1]).slice(0, Number(n))) console.log(`  ${pct(c)}  ${fn}`);
}
