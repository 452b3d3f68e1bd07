// SPDX-License-Identifier: Apache-2.0

// Real parts for the tests: an idemsvc binary built from this repository,
// and Redis servers on free loopback ports. Every process started here is
// killed by its own PID when the test file ends.
import { spawn, spawnSync } from 'node:child_process';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { homedir, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = join(here, '..', '..', '..');
const defaultBinary = join(here, '..', '.cache', 'idemsvc');

const started = new Set();
function killStarted() {
  for (const child of started) child.kill('SIGKILL');
}
process.on('exit', killStarted);
// Ended by a signal (Ctrl-C, or the runner's timeout), a process does not
// run its exit handlers: kill what was started here, then end as asked.
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, () => {
    killStarted();
    process.kill(process.pid, signal);
  });
}

/** The idemsvc binary: IDEM_TS_TEST_BIN, or built from the repository (test/build-idemsvc.mjs does it once for npm test). */
export function idemsvcBinary() {
  const given = process.env.IDEM_TS_TEST_BIN;
  if (given) return given;
  if (!existsSync(defaultBinary)) buildIdemsvc();
  return defaultBinary;
}

export function buildIdemsvc() {
  mkdirSync(dirname(defaultBinary), { recursive: true });
  const out = spawnSync('go', ['build', '-o', defaultBinary, './cmd/idemsvc'], { cwd: repoRoot, stdio: 'inherit' });
  if (out.status !== 0) throw new Error(`go build ./cmd/idemsvc failed (${out.status ?? out.signal})`);
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Starts a child process that is killed, by its PID, at exit. */
function startProcess(command, args, env) {
  const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  started.add(child);
  let output = '';
  const keep = (b) => {
    output = (output + b.toString()).slice(-4000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  // A missing binary (redis-server not installed, say) fails the test that
  // needed it, saying so, instead of crashing the test file.
  child.on('error', (err) => {
    output += `${command}: ${err.message}\n`;
  });
  child.on('exit', () => started.delete(child));
  return {
    child,
    output: () => output,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
    },
  };
}

/** Polls check (sync or async; a throw counts as false) until it holds, for up to timeoutMs. */
export async function eventually(what, check, timeoutMs = 15_000, output = () => '') {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await Promise.resolve().then(check).catch(() => false)) return;
    if (Date.now() > end) throw new Error(`${what}: not within ${timeoutMs} ms\n${output()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function redisPing(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.setTimeout(500);
    socket.on('connect', () => socket.write('PING\r\n'));
    socket.on('data', (b) => {
      resolve(b.toString().startsWith('+PONG'));
      socket.destroy();
    });
    socket.on('error', () => resolve(false));
    socket.on('timeout', () => {
      resolve(false);
      socket.destroy();
    });
  });
}

/** A redis-server of the test's own on a free loopback port, without persistence. */
export async function startRedis() {
  const port = await freePort();
  const proc = startProcess('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    PATH: process.env.PATH,
  });
  await eventually('redis-server', () => redisPing(port), 10_000, proc.output);
  return {
    url: `redis://127.0.0.1:${port}`,
    pause: () => proc.child.kill('SIGSTOP'),
    resume: () => proc.child.kill('SIGCONT'),
    stop: () => {
      proc.child.kill('SIGCONT');
      return proc.stop();
    },
  };
}

const sha256 = (s) => createHash('sha256').update(s).digest('hex');

/**
 * Starts idemsvc on a free loopback port, on Redis when redisUrl is given
 * and on its in-memory store otherwise, with a tenants file: tenant `ts`
 * (apiKey, no limits) and tenant `limited` (limitedKey: one begin per
 * second, burst 1).
 */
export async function startIdemsvc({ redisUrl, port, env: extraEnv } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'idemsvc-ts-'));
  const apiKey = randomBytes(16).toString('hex');
  const limitedKey = randomBytes(16).toString('hex');
  const tenantsFile = join(dir, 'tenants.yaml');
  writeFileSync(
    tenantsFile,
    JSON.stringify({
      tenants: [
        { name: 'ts', api_key_sha256: [sha256(apiKey)] },
        { name: 'limited', api_key_sha256: [sha256(limitedKey)], limits: { begins_per_s: 1, burst: 1 } },
      ],
    }),
  );
  port ??= await freePort();
  const env = { PATH: process.env.PATH, IDEMSVC_LISTEN: `127.0.0.1:${port}`, IDEMSVC_TENANTS_FILE: tenantsFile, IDEMSVC_LOG_LEVEL: 'warn' };
  if (redisUrl) env.IDEMSVC_REDIS_URL = redisUrl;
  Object.assign(env, extraEnv);
  const proc = startProcess(idemsvcBinary(), [], env);
  const baseUrl = `http://127.0.0.1:${port}`;
  await eventually('idemsvc', async () => (await fetch(`${baseUrl}/healthz`)).ok, 15_000, proc.output);
  return {
    baseUrl,
    apiKey,
    limitedKey,
    output: proc.output,
    /** The process's peak resident memory (VmHWM) in bytes. */
    peakRss: () => procStatusBytes(proc.child.pid, 'VmHWM'),
    async stop() {
      await proc.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A field of /proc/<pid>/status given in kB, in bytes. */
function procStatusBytes(pid, field) {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}

/** The versitygw release scripts/test.sh installs, as internal/testkit/s3test has it. */
const VERSITYGW_VERSION = 'v1.8.0';

/**
 * versitygw: IDEMSVC_TEST_VERSITYGW, PATH, or the cache directory
 * scripts/test.sh builds it in. Missing, it fails the test saying so.
 */
export function versitygwBinary() {
  const given = process.env.IDEMSVC_TEST_VERSITYGW;
  if (given) return given;
  for (const dir of (process.env.PATH ?? '').split(':')) {
    if (dir && existsSync(join(dir, 'versitygw'))) return join(dir, 'versitygw');
  }
  const cached = join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'idemsvc-tools', `versitygw-${VERSITYGW_VERSION}`, 'versitygw');
  if (existsSync(cached)) return cached;
  throw new Error(
    `versitygw ${VERSITYGW_VERSION} not found: run make test (scripts/test.sh installs it), or go install github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION} and set IDEMSVC_TEST_VERSITYGW`,
  );
}

/**
 * An S3-compatible store of the test's own: versitygw with its posix
 * backend over a temporary directory, on a free loopback port, with one
 * bucket. env() is what idemsvc needs to keep large bodies there;
 * objectPath(key) is where an object's bytes lie, to damage them below the
 * S3 API.
 */
export async function startVersitygw() {
  const bin = versitygwBinary();
  const dir = mkdtempSync(join(tmpdir(), 'versitygw-ts-'));
  const data = join(dir, 'data');
  mkdirSync(data);
  const access = 'idemsvc-test';
  const secret = 'idemsvc-test-secret';
  const region = 'us-east-1';
  const bucket = 'idemsvc';
  const port = await freePort();
  const proc = startProcess(bin, ['--access', access, '--secret', secret, '--region', region, '--port', `127.0.0.1:${port}`, '--quiet', 'posix', data], {
    PATH: process.env.PATH,
    HOME: dir,
  });
  const endpoint = `http://127.0.0.1:${port}`;
  await eventually('versitygw', () => tcpOpen(port), 15_000, proc.output);
  const res = await fetch(`${endpoint}/${bucket}`, { method: 'PUT', headers: sigV4('PUT', `/${bucket}`, `127.0.0.1:${port}`, access, secret, region) });
  if (!res.ok) throw new Error(`create bucket: ${res.status} ${await res.text()}`);
  return {
    endpoint,
    objectPath: (key) => join(data, bucket, key),
    bucketDir: join(data, bucket),
    env: (prefix) => ({
      IDEMSVC_BLOB_URL: `s3://${bucket}/${prefix}`,
      AWS_ENDPOINT_URL_S3: endpoint,
      AWS_REGION: region,
      AWS_ACCESS_KEY_ID: access,
      AWS_SECRET_ACCESS_KEY: secret,
      AWS_CONFIG_FILE: join(dir, 'none'),
      AWS_SHARED_CREDENTIALS_FILE: join(dir, 'none'),
      IDEMSVC_BLOB_SPOOL_DIR: dir,
    }),
    async stop() {
      await proc.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function tcpOpen(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.on('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.on('error', () => resolve(false));
  });
}

/** The headers of an AWS Signature Version 4 request to S3 without a body. */
function sigV4(method, path, host, access, secret, region) {
  const now = new Date().toISOString().replace(/[-:]|\.\d{3}/g, '');
  const day = now.slice(0, 8);
  const empty = createHash('sha256').update('').digest('hex');
  const signed = 'host;x-amz-content-sha256;x-amz-date';
  const canonical = [method, path, '', `host:${host}`, `x-amz-content-sha256:${empty}`, `x-amz-date:${now}`, '', signed, empty].join('\n');
  const scope = `${day}/${region}/s3/aws4_request`;
  const toSign = ['AWS4-HMAC-SHA256', now, scope, createHash('sha256').update(canonical).digest('hex')].join('\n');
  let key = `AWS4${secret}`;
  for (const part of [day, region, 's3', 'aws4_request']) key = createHmac('sha256', key).update(part).digest();
  const signature = createHmac('sha256', key).update(toSign).digest('hex');
  return {
    'x-amz-content-sha256': empty,
    'x-amz-date': now,
    authorization: `AWS4-HMAC-SHA256 Credential=${access}/${scope}, SignedHeaders=${signed}, Signature=${signature}`,
  };
}

/** The stores every client and doOnce test runs on. */
export const stores = ['memory', 'redis'];

/** idemsvc on the named store, with its Redis if any; stop() stops both. */
export async function startOn(store) {
  const redis = store === 'redis' ? await startRedis() : undefined;
  const svc = await startIdemsvc({ redisUrl: redis?.url });
  return {
    ...svc,
    redis,
    async stop() {
      await svc.stop();
      await redis?.stop();
    },
  };
}

/** A key unique to this run. */
export function uniqueKey(prefix = 'k') {
  return `${prefix}-${randomBytes(8).toString('hex')}`;
}
