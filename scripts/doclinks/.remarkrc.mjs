// SPDX-License-Identifier: Apache-2.0
// remark's configuration for scripts/doclinks.sh: links only. Plugins
// are found in the node_modules beside this file.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import remarkValidateLinks from 'remark-validate-links';

export default {
  plugins: [
    [
      remarkValidateLinks,
      {
        // Named here rather than read from the Git remote, which a
        // worktree or a CI checkout may lack: a link to a file of this
        // repository on GitHub is then checked against the local file.
        repository: 'https://github.com/idemsvc/idemsvc',
        root: path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..'),
      },
    ],
  ],
};
