package api

import (
	"encoding/json"
	"testing"
	"time"
)

// The hand-written encoding of Begin201JSONResponse writes what
// encoding/json writes for the same struct.
func TestBegin201MarshalsLikeEncodingJSON(t *testing.T) {
	at := NewMilliTime(time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC))
	for _, key := range []string{"k", `{}*?\`, `"quoted"`, "<a&b>", "\x01\u00e9\xff", ""} {
		for _, recovered := range []bool{false, true} {
			r := Begin201JSONResponse{Attempt: 12, Key: key, LeaseExpiresAt: at,
				LeaseToken: "3f2a9c0d5b7e41c8a6d09e2f7b1c4a55", Recovered: recovered, Status: BeginAcquiredStatusAcquired}
			got, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			want, err := json.Marshal(BeginAcquired(r)) // the same fields, by reflection
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("key %q:\n got %s\nwant %s", key, got, want)
			}
		}
	}
}
