#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
// begin -> complete -> replayed begin against idemsvc, with Node.js's
// built-in fetch (Node 18 or later) and no packages.
//
//   IDEMSVC_URL=http://127.0.0.1:8080 IDEMSVC_API_KEY=... node begin-complete-replay.mjs
//
// IDEMSVC_URL defaults to http://127.0.0.1:8080; IDEMSVC_API_KEY is sent as a
// bearer token when set. Each run uses a new key. Exits 0 when the replayed
// begin gives back the completed response, 1 otherwise.
import { randomBytes } from "node:crypto";

const base = (process.env.IDEMSVC_URL || "http://127.0.0.1:8080").replace(/\/+$/, "");
const apiKey = process.env.IDEMSVC_API_KEY || "";
const rand = randomBytes(6).toString("hex");
const key = `polyglot-node-${Date.now()}-${process.pid}-${rand}`;

function fail(message) {
  console.error(`begin-complete-replay.mjs: ${message}`);
  process.exit(1);
}

// post sends body as JSON to base/v1/path and returns the HTTP status and
// the parsed answer.
async function post(path, body) {
  const headers = { "Content-Type": "application/json" };
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  let res;
  try {
    res = await fetch(`${base}/v1/${path}`, { method: "POST", headers, body: JSON.stringify(body) });
  } catch (err) {
    fail(`${path}: cannot reach idemsvc at ${base}: ${err.cause?.message ?? err.message}`);
  }
  const text = await res.text();
  try {
    return { status: res.status, json: JSON.parse(text) };
  } catch {
    fail(`${path}: HTTP ${res.status}, not JSON: ${text}`);
  }
}

console.log(`key:      ${key}`);

// 1. begin: the key is new, so this caller acquires it.
const begun = await post("begin", { key, owner: `node-${rand}` });
if (begun.status !== 201 || begun.json.status !== "acquired" || !begun.json.lease_token) {
  fail(`begin: HTTP ${begun.status}, want 201 acquired with a lease_token: ${JSON.stringify(begun.json)}`);
}
console.log(`begin:    ${begun.status} acquired, attempt ${begun.json.attempt}`);

// 2. The operation runs here (say it created a charge); then complete
// stores its response.
const response = {
  status_code: 201,
  headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ charge_id: `ch_${rand}`, amount: 1000 }),
};
const completed = await post("complete", { key, lease_token: begun.json.lease_token, response });
if (completed.status !== 200 || completed.json.status !== "completed") {
  fail(`complete: HTTP ${completed.status}, want 200 completed: ${JSON.stringify(completed.json)}`);
}
console.log(`complete: ${completed.status} completed`);

// 3. A duplicate begins the same key: it must not run the operation again
// but get the stored response back.
const replay = await post("begin", { key });
if (replay.status !== 200 || replay.json.status !== "completed") {
  fail(`replay: HTTP ${replay.status}, want 200 completed with the stored response: ${JSON.stringify(replay.json)}`);
}
const got = replay.json.response ?? {};
const problems = [];
if (got.status_code !== response.status_code) problems.push(`status_code ${got.status_code}, want ${response.status_code}`);
if (got.body !== response.body) problems.push(`body ${JSON.stringify(got.body)}, want ${JSON.stringify(response.body)}`);
if ((got.body_encoding ?? "text") !== "text") problems.push(`body_encoding ${got.body_encoding}, want text`);
if (got.headers?.["Content-Type"] !== "application/json") problems.push(`headers ${JSON.stringify(got.headers)}, want Content-Type: application/json`);
if (replay.json.attempt !== begun.json.attempt) problems.push(`attempt ${replay.json.attempt}, want ${begun.json.attempt}`);
if (problems.length > 0) {
  fail(`replay: not the completed response: ${problems.join("; ")}`);
}
console.log(`replay:   ${replay.status} completed, response ${got.status_code} ${got.body}`);
console.log("ok: the replayed begin gave back the completed response");
