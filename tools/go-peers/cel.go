// cel: cel-go (cel.dev/cel-go) evaluating health-check expressions, the
// reference the Rust evaluator of ichor-gate is compared with. Reads JSON
// lines {"expr": "...", "object": {...}} on stdin and writes one JSON line
// per input: {"value": <canonical>} or {"error": "..."}.
//
// The environment is the one Ichor gives its checks: `object` (dyn), the
// strings extension and optional values (`a[?k].orValue(d)`), as
// Kubernetes enables them. JSON numbers are read as Kubernetes reads integer
// fields: int64 when they fit, else uint64, else float64. Values are
// written in ichor-gate's canonical form (expr::canonical): numbers tagged
// with their type (a double by its bits), map keys as "type:key", sorted.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/ext"
)

func init() {
	register("cel", "evaluate CEL expressions on JSON objects (cel-go), one JSON line each", runCEL)
}

type celInput struct {
	Expr   string          `json:"expr"`
	Object json.RawMessage `json:"object"`
}

func runCEL(args []string) int {
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType), ext.Strings(), cel.OptionalTypes())
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-peers cel: environment:", err)
		return 1
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		line := in.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var input celInput
		if err := json.Unmarshal(line, &input); err != nil {
			fmt.Fprintln(os.Stderr, "go-peers cel: bad input line:", err)
			return 1
		}
		result := celEvalOne(env, input)
		text, err := json.Marshal(result)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go-peers cel: writing a result:", err)
			return 1
		}
		out.Write(text)
		out.WriteByte('\n')
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "go-peers cel: reading stdin:", err)
		return 1
	}
	return 0
}

func celEvalOne(env *cel.Env, input celInput) map[string]any {
	object, err := celReadObject(input.Object)
	if err != nil {
		return map[string]any{"error": "object: " + err.Error()}
	}
	ast, iss := env.Compile(input.Expr)
	if iss.Err() != nil {
		return map[string]any{"error": "compile: " + iss.Err().Error()}
	}
	prg, err := env.Program(ast)
	if err != nil {
		return map[string]any{"error": "program: " + err.Error()}
	}
	val, _, err := prg.Eval(map[string]any{"object": object})
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	c, err := celCanonical(val)
	if err != nil {
		return map[string]any{"error": "result: " + err.Error()}
	}
	return map[string]any{"value": c}
}

// celReadObject decodes JSON keeping numbers exact, then types them.
func celReadObject(raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return celTypeNumbers(v), nil
}

func celTypeNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		if u, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			return u
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = celTypeNumbers(x[i])
		}
		return x
	case map[string]any:
		for k := range x {
			x[k] = celTypeNumbers(x[k])
		}
		return x
	default:
		return v
	}
}

func celDoubleBits(f float64) string {
	if math.IsNaN(f) {
		return "nan"
	}
	return fmt.Sprintf("%016x", math.Float64bits(f))
}

func celKeyText(k ref.Val) (string, error) {
	switch x := k.(type) {
	case types.String:
		return "string:" + string(x), nil
	case types.Int:
		return fmt.Sprintf("int:%d", int64(x)), nil
	case types.Uint:
		return fmt.Sprintf("uint:%d", uint64(x)), nil
	case types.Bool:
		return fmt.Sprintf("bool:%t", bool(x)), nil
	}
	return "", fmt.Errorf("map key of type %s", k.Type())
}

func celCanonical(v ref.Val) (any, error) {
	switch x := v.(type) {
	case types.Null:
		return nil, nil
	case types.Bool:
		return bool(x), nil
	case types.Int:
		return map[string]any{"int": strconv.FormatInt(int64(x), 10)}, nil
	case types.Uint:
		return map[string]any{"uint": strconv.FormatUint(uint64(x), 10)}, nil
	case types.Double:
		return map[string]any{"double": celDoubleBits(float64(x))}, nil
	case types.String:
		return map[string]any{"string": string(x)}, nil
	case types.Bytes:
		return map[string]any{"bytes": fmt.Sprintf("%x", []byte(x))}, nil
	}
	if m, ok := v.(traits.Mapper); ok {
		out := map[string]any{}
		it := m.Iterator()
		for it.HasNext() == types.True {
			k := it.Next()
			kt, err := celKeyText(k)
			if err != nil {
				return nil, err
			}
			c, err := celCanonical(m.Get(k))
			if err != nil {
				return nil, err
			}
			out[kt] = c
		}
		return map[string]any{"map": out}, nil
	}
	if l, ok := v.(traits.Lister); ok {
		out := []any{}
		it := l.Iterator()
		for it.HasNext() == types.True {
			c, err := celCanonical(it.Next())
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		return map[string]any{"list": out}, nil
	}
	return map[string]any{"other": fmt.Sprintf("%v", v.Value())}, nil
}
