// argolua: Argo CD's health-script contract, run by the Lua engine Argo CD
// uses (github.com/yuin/gopher-lua). As argo-cd's util/lua/lua.go does for
// a script from argocd-cm: only the base, package and table libraries are
// open (no string, math or io: a script must not need them), the live
// object is the global `obj`, the script has one second, and it returns a
// table {status, message}; a status outside Argo's set becomes Unknown.
// (Argo's "safe os" library is not loaded here: Ichor's scripts do not
// use it, so a script that did would fail here rather than pass.)
//
//	go-peers argolua run SCRIPT OBJECT      one verdict as JSON
//	go-peers argolua test DIR...            every health_test.yaml under DIR
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func init() {
	register("argolua", "Argo CD health scripts in gopher-lua: run SCRIPT OBJECT | test DIR...", runArgoLua)
}

type healthStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// The statuses Argo CD knows (gitops-engine pkg/health).
var validHealth = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true,
	"Suspended": true, "Missing": true, "Unknown": true,
}

func runArgoLua(args []string) int {
	if len(args) >= 1 && args[0] == "run" && len(args) == 3 {
		got, err := healthOf(args[1], args[2])
		if err != nil {
			fmt.Fprintf(os.Stderr, "argolua: %v\n", err)
			return 1
		}
		_ = json.NewEncoder(os.Stdout).Encode(got)
		return 0
	}
	if len(args) >= 2 && args[0] == "test" {
		return testDirs(args[1:])
	}
	fmt.Fprintln(os.Stderr, "usage: go-peers argolua run SCRIPT OBJECT | test DIR...")
	return 2
}

func readObject(path string) (map[string]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(js); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return u.Object, nil
}

func healthOf(scriptPath, objectPath string) (healthStatus, error) {
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return healthStatus{}, err
	}
	obj, err := readObject(objectPath)
	if err != nil {
		return healthStatus{}, err
	}
	return executeHealthLua(obj, string(script))
}

// executeHealthLua is lua.go's runLua and ExecuteHealthLua.
func executeHealthLua(obj map[string]any, script string) (healthStatus, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return healthStatus{}, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decodeValue(l, obj))
	if err := l.DoString(script); err != nil {
		return healthStatus{}, err
	}
	ret := l.Get(-1)
	switch ret.Type() {
	case lua.LTNil:
		return healthStatus{}, nil
	case lua.LTTable:
		tbl := ret.(*lua.LTable)
		got := healthStatus{
			Status:  lua.LVAsString(tbl.RawGetString("status")),
			Message: lua.LVAsString(tbl.RawGetString("message")),
		}
		if !validHealth[got.Status] {
			return healthStatus{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
		}
		return got, nil
	default:
		return healthStatus{}, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
}

// decodeValue is lua.go's: JSON values to Lua values, numbers as numbers.
func decodeValue(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case []any:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}

type healthTest struct {
	Tests []struct {
		HealthStatus healthStatus `json:"healthStatus"`
		InputPath    string       `json:"inputPath"`
	} `json:"tests"`
}

// testDirs runs every health_test.yaml case (argo-cd util/lua/health_test.go):
// the health.lua beside it on each input, status and message compared
// exactly. Prints one line per case; exit 1 if any differs.
func testDirs(dirs []string) int {
	cases, failed := 0, 0
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "health_test.yaml" {
				return err
			}
			base := filepath.Dir(path)
			raw, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var tests healthTest
			if err := yaml.UnmarshalStrict(raw, &tests); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			for _, tc := range tests.Tests {
				cases++
				got, err := healthOf(filepath.Join(base, "health.lua"), filepath.Join(base, tc.InputPath))
				switch {
				case err != nil:
					failed++
					fmt.Printf("FAIL %s %s: %v\n", base, tc.InputPath, err)
				case got != tc.HealthStatus:
					failed++
					fmt.Printf("FAIL %s %s: got %s %q, want %s %q\n", base, tc.InputPath, got.Status, got.Message, tc.HealthStatus.Status, tc.HealthStatus.Message)
				default:
					fmt.Printf("ok   %s %s: %s %q\n", base, tc.InputPath, got.Status, got.Message)
				}
			}
			return nil
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "argolua: %v\n", err)
			return 1
		}
	}
	fmt.Printf("%d cases, %d failed\n", cases, failed)
	if failed > 0 || cases == 0 {
		return 1
	}
	return 0
}
