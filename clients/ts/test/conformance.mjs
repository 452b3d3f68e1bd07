// SPDX-License-Identifier: Apache-2.0

// The shared middleware conformance suite (conformance/cases.json, its
// format in conformance/README.md), run against an entry point in front of
// the conformance app, with a real idemsvc behind it.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { IdemClient } from '@idemsvc/client';
import { freePort, repoRoot, uniqueKey } from './harness.mjs';

export const { cases } = JSON.parse(readFileSync(join(repoRoot, 'conformance', 'cases.json'), 'utf8'));

/**
 * Registers a test per case. start(client, { scoped }) serves the entry
 * point, with the app behind it (its run count starting at 0), and
 * resolves to { port, runs(), close() }; scoped: with a scope, the end user
 * named by the X-User header. getSvc() is the idemsvc to use;
 * clientOptions join the client's options.
 */
export function conformanceTests(entryPoint, getSvc, start, clientOptions = {}) {
  for (const c of cases) {
    test(`${entryPoint}: ${c.name}`, async () => {
      const svc = getSvc();
      const baseUrl = c.idemsvc === 'down' ? `http://127.0.0.1:${await freePort()}` : svc.baseUrl;
      const client = new IdemClient({ ...clientOptions, baseUrl, apiKey: svc.apiKey });
      const server = await start(client, { scoped: c.scoped === true });
      try {
        await runCase(c, server.port, uniqueKey(`conf-${entryPoint}`));
        assert.equal(server.runs(), c.calls, `the app ran ${server.runs()} times, want ${c.calls}`);
      } finally {
        await server.close();
      }
    });
  }
}

async function runCase(c, port, key) {
  const answers = [];
  const inFlight = [];
  let previousStart = 0;
  for (const [i, step] of c.steps.entries()) {
    if (step.with_previous) {
      await delay(Math.max(0, previousStart + (step.delay_ms ?? 0) - Date.now()));
    } else {
      await Promise.all(inFlight);
    }
    previousStart = Date.now();
    inFlight.push(send(port, step, key).then((a) => (answers[i] = a)));
  }
  await Promise.all(inFlight);
  for (const [i, step] of c.steps.entries()) check(i, step.expect, answers[i], answers);
}

/** The key header's value: {key} is the case's key, {key:N} that key padded with k to N bytes. */
function expandKey(value, key) {
  return value.replace(/\{key(?::(\d+))?\}/g, (_, n) => key + 'k'.repeat(Math.max(0, Number(n ?? 0) - key.length)));
}

/** Sends a step's request on a connection of its own: { status, headers, body } or { error }. */
function send(port, step, key) {
  const headers = {};
  for (const [name, value] of Object.entries(step.headers ?? {})) headers[name] = value;
  if (step.key !== undefined) headers['Idempotency-Key'] = expandKey(step.key, key);
  let body;
  if (step.body_bytes !== undefined) body = Buffer.alloc(step.body_bytes, 'x');
  else if (step.body !== undefined) body = Buffer.from(step.body);
  if (body !== undefined) {
    if (!Object.keys(headers).some((name) => name.toLowerCase() === 'content-type')) headers['Content-Type'] = 'application/octet-stream';
    headers['Content-Length'] = String(body.length);
  }
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, method: step.method, path: step.path, headers, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', (error) => resolve({ error }));
    });
    req.on('error', (error) => resolve({ error }));
    req.end(body);
  });
}

function check(i, want, got, answers) {
  const where = `step ${i}`;
  if (want.status === 'any') return;
  assert.ok(!got.error, `${where}: ${got.error}`);
  assert.equal(got.status, want.status, `${where}: status; body ${got.body}`);
  for (const [name, value] of Object.entries(want.headers ?? {})) {
    assert.equal(got.headers[name.toLowerCase()], value ?? undefined, `${where}: header ${name}`);
  }
  if (want.body !== undefined) assert.equal(got.body.toString(), want.body, `${where}: body`);
  if (want.body_of !== undefined) assert.ok(got.body.equals(answers[want.body_of].body), `${where}: body is not step ${want.body_of}'s`);
  if (want.body_bytes !== undefined) assert.equal(got.body.length, want.body_bytes, `${where}: body length`);
  if (want.problem !== undefined) {
    assert.equal(got.headers['content-type'], 'application/problem+json', `${where}: content type`);
    const problem = JSON.parse(got.body.toString());
    assert.ok(problem.type.endsWith(`/problems/${want.problem}`), `${where}: problem ${problem.type}`);
    assert.equal(problem.code, want.problem, `${where}: problem code`);
    assert.equal(problem.status, got.status, `${where}: problem status`);
  }
  if (want.retry_after_max !== undefined) {
    const retryAfter = got.headers['retry-after'];
    assert.match(retryAfter ?? '', /^\d+$/, `${where}: Retry-After ${retryAfter}`);
    assert.ok(Number(retryAfter) <= want.retry_after_max, `${where}: Retry-After ${retryAfter}`);
  }
}
