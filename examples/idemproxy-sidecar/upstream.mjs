// SPDX-License-Identifier: Apache-2.0

// A payments service that knows nothing of idempotency: every POST
// /payments charges again. idemproxy in front of it makes a retried POST
// charge once.
import http from 'node:http';

let charges = 0;
const server = http.createServer(async (req, res) => {
  let body = '';
  for await (const chunk of req) body += chunk;
  if (req.method === 'POST' && req.url === '/payments') {
    charges++;
    res.writeHead(201, { 'Content-Type': 'application/json', Location: `/payments/${charges}` });
    res.end(JSON.stringify({ id: charges, charged: JSON.parse(body || '{}').amount ?? 0 }));
    return;
  }
  if (req.method === 'GET' && req.url === '/charges') {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ charges }));
    return;
  }
  res.writeHead(404).end();
});
server.listen(Number(process.env.PORT ?? 3000), process.env.HOST ?? '0.0.0.0');
process.on('SIGTERM', () => server.close(() => process.exit(0)));
