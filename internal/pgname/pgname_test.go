package pgname

import "testing"

func TestName(t *testing.T) {
	for _, tc := range []struct {
		schema Schema
		name   string
		want   string
	}{
		{Public, "tokens", `"public"."tokens"`},
		{`My "Schema"`, "tailer_slot", `"My ""Schema"""."tailer_slot"`},
		{"a.b", "c", `"a.b"."c"`},
	} {
		if got := tc.schema.Name(tc.name); got != tc.want {
			t.Errorf("%q.Name(%q) = %s, want %s", tc.schema, tc.name, got, tc.want)
		}
	}
	if got := Schema("o'neil").Literal(); got != `'o''neil'` {
		t.Errorf("Literal = %s", got)
	}
	if got := Schema(`x"y`).Ident(); got != `"x""y"` {
		t.Errorf("Ident = %s", got)
	}
}

func TestCheck(t *testing.T) {
	for s, ok := range map[Schema]bool{"public": true, "": false, "a\x00b": false, Schema(make([]byte, 64)): false, "Ünïcode schema": true} {
		if err := s.Check(); (err == nil) != ok {
			t.Errorf("Check(%q) = %v", s, err)
		}
	}
}

func TestIsolate(t *testing.T) {
	p := map[string]string{"search_path": "evil, public", "application_name": "x"}
	Isolate(p)
	if p["search_path"] != SearchPath || p["application_name"] != "x" {
		t.Errorf("Isolate: %v", p)
	}
}
