// SPDX-License-Identifier: Apache-2.0

// Builds the idemsvc binary the tests run (go build is incremental: a
// no-op when nothing changed), once before node --test starts the files.
import { buildIdemsvc } from './harness.mjs';

if (!process.env.IDEM_TS_TEST_BIN) buildIdemsvc();
