package api_test

import (
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// The limits api/openapi.yaml states are the defaults the service
// enforces: the store's Limits and the handler's body and wait bounds.
func TestSpecStatesTheDefaultLimits(t *testing.T) {
	spec, err := openapi3.NewLoader().LoadFromFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l := statemachine.DefaultLimits()
	schema := func(name string) *openapi3.Schema {
		s := spec.Components.Schemas[name]
		if s == nil || s.Value == nil {
			t.Fatalf("no schema %s", name)
		}
		return s.Value
	}
	begin := schema("BeginRequest").Properties
	for _, tt := range []struct {
		what     string
		got      float64
		want     float64
		gotUpper *float64
		wantMax  float64
	}{
		{"LeaseMs", *schema("LeaseMs").Min, float64(l.MinLease / time.Millisecond), schema("LeaseMs").Max, float64(l.MaxLease / time.Millisecond)},
		{"RetentionS", *schema("RetentionS").Min, float64(l.MinRetention / time.Second), schema("RetentionS").Max, float64(l.MaxRetention / time.Second)},
		{"wait_ms", *begin["wait_ms"].Value.Min, 0, begin["wait_ms"].Value.Max, float64(handlers.DefaultMaxWait / time.Millisecond)},
	} {
		if tt.got != tt.want || tt.gotUpper == nil || *tt.gotUpper != tt.wantMax {
			t.Errorf("%s: the spec says %v to %v, the service %v to %v", tt.what, tt.got, tt.gotUpper, tt.want, tt.wantMax)
		}
	}
	// Lengths of strings that may hold any UTF-8 are in bytes, which
	// maxLength (characters) cannot state: x-max-bytes does.
	for _, tt := range []struct {
		field *openapi3.SchemaRef
		name  string
		want  int
	}{
		{begin["fingerprint"], "fingerprint", l.MaxFingerprintBytes},
		{begin["owner"], "owner", l.MaxOwnerBytes},
		{schema("FailRequest").Properties["error"], "error", l.MaxErrorBytes},
	} {
		got, _ := tt.field.Value.Extensions["x-max-bytes"].(float64)
		if int(got) != tt.want || tt.field.Value.MaxLength != nil {
			t.Errorf("%s: the spec says x-max-bytes %v (maxLength %v), the service %d bytes", tt.name, got, tt.field.Value.MaxLength, tt.want)
		}
	}
	if got := schema("Key").MaxLength; got == nil || int(*got) != l.MaxKeyBytes {
		t.Errorf("key: the spec's maxLength is %v, the service's %d", got, l.MaxKeyBytes)
	}
}
