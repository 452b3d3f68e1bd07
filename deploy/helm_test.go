// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var settingName = regexp.MustCompile(`\b(?:IDEMSVC|IDEMPROXY)_[A-Z0-9_]*[A-Z0-9]\b`)

// notSettings are named in the charts as what must not reach idemsvc: the
// variables Kubernetes' service links would add for a Service named
// idemsvc (the chart turns them off).
var notSettings = map[string]bool{"IDEMSVC_PORT": true, "IDEMSVC_SERVICE_HOST": true}

// Every IDEMSVC_* or IDEMPROXY_* variable a chart (templates, values, value
// sets, README, notes) names is one that the program it configures reads:
// idemsvc for helm/idemsvc, idemproxy for helm/idemproxy-sidecar.
func TestChartSettings(t *testing.T) {
	for dir, known := range map[string]map[string]bool{
		"helm/idemsvc":           idemsvcVars(t),
		"helm/idemproxy-sidecar": idemproxyVars(t),
	} {
		found := 0
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, name := range settingName.FindAllString(string(data), -1) {
				found++
				if !known[name] && !notSettings[name] {
					t.Errorf("%s names %s, which the program it configures does not read", path, name)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if found < 5 {
			t.Errorf("%s: found %d settings", dir, found)
		}
	}
}
