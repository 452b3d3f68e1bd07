// SPDX-License-Identifier: Apache-2.0

// The TypeScript SDK's client CPU per call (make load-sdk's tsclient):
//
//   node client-cpu.mjs IDEMSVC_URL SDK_DIST SECONDS [coalesce]
//
// 16 loops at once, each a begin and a complete on a new key, with the
// fingerprint and response the Express middleware sends, for SECONDS
// after a second's warm-up. Prints the calls made, this process's CPU
// (user + system, process.cpuUsage) in µs per call, and calls per second.
// The API key comes from IDEMSVC_API_KEY. With coalesce, the client is
// made with that option: the calls of one turn of the event loop go as
// one batch call.
import { randomBytes } from 'node:crypto';

const [url, dist, seconds, mode] = process.argv.slice(2);
const { IdemClient } = await import(`${dist}/index.js`);
const client = new IdemClient({ baseUrl: url, apiKey: process.env.IDEMSVC_API_KEY, coalesce: mode === 'coalesce' });
const prefix = `cpu-${randomBytes(6).toString('hex')}`;
const fingerprint = 'v1:' + randomBytes(32).toString('hex');
const response = { status_code: 201, headers: { 'content-type': 'application/json' }, body: '{"payment":"accepted"}\n\n' };

let calls = 0;
let seq = 0;
async function loop(until) {
  while (Date.now() < until) {
    const key = `${prefix}-${seq++}`;
    const lease = await client.begin({ key, fingerprint, lease_ms: 30000 });
    if (lease.status !== 'acquired') throw new Error(`begin of a new key: ${lease.status}`);
    await client.complete({ key, lease_token: lease.lease_token, response });
    calls += 2;
  }
}
const run = (ms) => Promise.all(Array.from({ length: 16 }, () => loop(Date.now() + ms)));

await run(1000);
calls = 0;
const cpu0 = process.cpuUsage();
const t0 = process.hrtime.bigint();
await run(Number(seconds) * 1000);
const cpu = process.cpuUsage(cpu0);
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(calls, ((cpu.user + cpu.system) / calls).toFixed(1), (calls / secs).toFixed(0));
