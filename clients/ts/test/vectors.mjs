// SPDX-License-Identifier: Apache-2.0

// conformance/fingerprints.json: the fingerprints and stored keys that the
// Go SDK's tests hold it to as well.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from './harness.mjs';

export const vectors = JSON.parse(readFileSync(join(repoRoot, 'conformance', 'fingerprints.json'), 'utf8'));
