// SPDX-License-Identifier: Apache-2.0

// Package encodecheck guards idemsvc's hand-written JSON encoders (the
// service's hot answers, the Go client's hot request bodies) against
// drifting from the types oapi-codegen generates from api/openapi.yaml.
// Fixtures hold the fields of the day they were written; a field added to
// the spec later, optional most likely, would be left out by the encoder
// and every fixture would still pass. Here the value is built by
// reflection over the generated type, every field set, so a new field is
// in it the moment it is generated.
//
// Only tests import it. It is a package of the client's module, as
// millitime is, so that both modules' tests share it: the client module
// may not import the service's, and it needs nothing beyond the standard
// library.
package encodecheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Filled returns a T with every field set, optional ones included, to a
// value that is not its zero value and, where the kind allows, differs
// from every other field's: strings name their field, numbers count up.
// Pointers point at filled values, maps and slices hold one filled
// element. A field of a kind it cannot fill fails t, naming it.
func Filled[T any](t testing.TB) T {
	t.Helper()
	var v T
	f := filler{t: t}
	f.fill(reflect.ValueOf(&v).Elem(), reflect.TypeFor[T]().Name())
	return v
}

type filler struct {
	t testing.TB
	n int // the last number given out
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

func (f *filler) fill(v reflect.Value, path string) {
	f.n++
	switch {
	case v.Type() == timeType:
		v.Set(reflect.ValueOf(time.Date(2026, 11, 21, 12, 0, f.n, f.n*int(time.Millisecond), time.UTC)))
		return
	case v.Type() == rawType:
		v.SetBytes([]byte(fmt.Sprintf("%q", path)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("%s-%d", path, f.n))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(f.n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(f.n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(f.n) + 0.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		f.fill(v.Elem(), path)
	case reflect.Struct:
		for i := range v.NumField() {
			if field := v.Type().Field(i); field.IsExported() {
				f.fill(v.Field(i), path+"."+field.Name)
			}
		}
	case reflect.Map:
		m := reflect.MakeMapWithSize(v.Type(), 1)
		key, elem := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		f.fill(key, path+"[key]")
		f.fill(elem, path+"[value]")
		m.SetMapIndex(key, elem)
		v.Set(m)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		f.fill(s.Index(0), path+"[0]")
		v.Set(s)
	default:
		f.t.Fatalf("encodecheck: cannot fill %s, of kind %s: teach Filled its kind", path, v.Kind())
	}
}

// Check fails t unless encoded, what a hand-written encoder wrote for v,
// holds a member for every JSON name of v's type, nested objects
// included, and decodes back to what encoding/json makes of v.
func Check[T any](t testing.TB, v T, encoded []byte) {
	t.Helper()
	var got any
	if err := json.Unmarshal(encoded, &got); err != nil {
		t.Fatalf("%T: the encoder wrote no JSON (%v): %s", v, err, encoded)
		return
	}
	for _, missing := range missingMembers(reflect.ValueOf(v), got, reflect.TypeFor[T]().Name()) {
		t.Errorf("%T: the encoder leaves out %s: teach it the field\n got %s", v, missing, encoded)
	}
	var back T
	if err := json.Unmarshal(encoded, &back); err != nil {
		t.Fatalf("%T: %v: %s", v, err, encoded)
		return
	}
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
		return
	}
	again, err := json.Marshal(back)
	if err != nil {
		t.Fatal(err)
		return
	}
	if !bytes.Equal(again, want) {
		t.Errorf("%T does not round-trip through the encoder:\n got %s\nwant %s", v, again, want)
	}
}

var marshalerType = reflect.TypeFor[json.Marshaler]()

// missingMembers lists the JSON names of v (a struct, or a pointer to
// one) that the decoded JSON got lacks, by path.
func missingMembers(v reflect.Value, got any, path string) []string {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || v.Type().Implements(marshalerType) || reflect.PointerTo(v.Type()).Implements(marshalerType) {
		return nil
	}
	object, ok := got.(map[string]any)
	if !ok {
		return []string{path + " (not an object)"}
	}
	var missing []string
	for i := range v.NumField() {
		field := v.Type().Field(i)
		name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
		if !field.IsExported() || name == "-" {
			continue
		}
		if field.Anonymous && name == "" { // its members are v's
			missing = append(missing, missingMembers(v.Field(i), got, path)...)
			continue
		}
		if name == "" {
			name = field.Name
		}
		member, ok := object[name]
		if !ok {
			missing = append(missing, path+"."+name)
			continue
		}
		missing = append(missing, missingMembers(v.Field(i), member, path+"."+name)...)
	}
	return missing
}
