// SPDX-License-Identifier: Apache-2.0

// Package console serves the operators' console: static pages embedded in
// the binary (no CDN, no request elsewhere), which sign in with an API key
// and call the same JSON API as every client. Plain HTML, CSS and ES
// modules, with no front-end framework and no build step.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// Path is where the console is served.
const Path = "/console/"

//go:embed assets
var assets embed.FS

// Assets are the console's files, for tests that weigh them.
func Assets() fs.FS {
	sub, _ := fs.Sub(assets, "assets") // "assets" is embedded: Sub cannot fail
	return sub
}

// securityHeaders are set on every answer under Path. The page runs no
// inline script or style, loads nothing from elsewhere, may not be framed,
// and sends no Referer (its URL holds a tenant and a key).
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
		"connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
	"X-Frame-Options":        "DENY",
	"Cache-Control":          "no-cache",
}

// Handler serves the console under Path and hands every other request to
// api. It sets no cookie: the page sends the API key it is given as a
// bearer token, so there is no ambient credential for another site to
// ride on.
func Handler(api http.Handler) http.Handler {
	files := http.StripPrefix(Path, http.FileServerFS(Assets()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == strings.TrimSuffix(Path, "/"):
			http.Redirect(w, r, Path, http.StatusMovedPermanently)
		case strings.HasPrefix(r.URL.Path, Path):
			for name, value := range securityHeaders {
				w.Header().Set(name, value)
			}
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			files.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	})
}
