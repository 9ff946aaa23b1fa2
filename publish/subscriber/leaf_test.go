package subscriber

import (
	"os/exec"
	"strings"
	"testing"
)

// The packages a consumer imports (this one, its decisions, the wire
// format, the servers' answers read one way, the token package and the
// short waits it builds on) import nothing of the
// producer: a service that reads the stream does not link the tailer's
// PostgreSQL, decoding or publishing code.
func TestImportsNothingOfTheProducer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	leaves := map[string]bool{
		"github.com/mailroom/tailer/publish/subscriber":          true,
		"github.com/mailroom/tailer/publish/subscriber/protocol": true,
		"github.com/mailroom/tailer/publish/wire":                true,
		"github.com/mailroom/tailer/publish/jsio":                true,
		"github.com/mailroom/tailer/publish/token":               true,
		"github.com/mailroom/tailer/internal/pause":              true,
		// What a decoded row means, read the same on both sides:
		// standard library only, of the decoder's room but not the decoder.
		"github.com/mailroom/tailer/decoder/action":      true,
		"github.com/mailroom/tailer/decoder/traceparent": true,
	}
	var producer []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/mailroom/tailer/") && !leaves[p] {
			producer = append(producer, p)
		}
	}
	if len(producer) > 0 {
		t.Fatalf("publish/subscriber imports the producer's packages: %v", producer)
	}
}
