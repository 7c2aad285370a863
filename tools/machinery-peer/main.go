// Command machinery-peer runs Talos's own config machinery (the Go module
// github.com/siderolabs/talos/pkg/machinery, at the version pinned in
// tools/versions.env) as a peer for Ichor's tests and benchmarks:
//
//	machinery-peer validate --mode metal|cloud|container [--strict] FILE
//	machinery-peer patch FILE --patch @P [--patch ...] -o OUT
//	machinery-peer patch --from-empty --patch @P [--patch ...] -o OUT
//	machinery-peer codec-bench --iterations N FILE...
//
// validate loads FILE and runs the client-side validation for the runtime
// mode, printing warnings and errors as talosctl validate does (exit 1 on
// errors). patch applies the patches as `talosctl machineconfig patch` does;
// with --from-empty it starts from a config holding no document, as Talos's
// API can (configpatcher.WithConfig of an empty container) and its CLI
// cannot (an empty file reads as no config).
// codec-bench loads and encodes each file N times and prints JSON figures.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
)

// mode is a validation.RuntimeMode: what Talos knows of where it runs.
type mode struct {
	name        string
	install     bool
	inContainer bool
}

func (m mode) String() string        { return m.name }
func (m mode) RequiresInstall() bool { return m.install }
func (m mode) InContainer() bool     { return m.inContainer }

func parseMode(s string) (mode, error) {
	switch s {
	case "metal":
		return mode{name: s, install: true}, nil
	case "cloud":
		return mode{name: s}, nil
	case "container":
		return mode{name: s, inContainer: true}, nil
	}

	return mode{}, fmt.Errorf("unknown mode %q: want metal, cloud or container", s)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}

	var err error

	switch os.Args[1] {
	case "validate":
		err = validate(os.Args[2:])
	case "patch":
		err = patch(os.Args[2:])
	case "codec-bench":
		err = codecBench(os.Args[2:])
	default:
		usage()
	}

	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: machinery-peer validate --mode metal|cloud|container [--strict] FILE\n"+
		"       machinery-peer patch FILE --patch @P [--patch @Q] -o OUT\n"+
		"       machinery-peer patch --from-empty --patch @P [--patch @Q] -o OUT\n"+
		"       machinery-peer codec-bench --iterations N FILE...")
	os.Exit(2)
}

// interleaved parses flags that may come before or after positional arguments.
func interleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string

	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}

		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}

		positional = append(positional, args[0])
		args = args[1:]
	}
}

func validate(args []string) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	modeName := fs.String("mode", "", "metal, cloud or container")
	strict := fs.Bool("strict", false, "treat warnings as errors")

	files, err := interleaved(fs, args)
	if err != nil {
		return err
	}

	if len(files) != 1 {
		return errors.New("validate takes one config file")
	}

	m, err := parseMode(*modeName)
	if err != nil {
		return err
	}

	cfg, err := configloader.NewFromFile(files[0])
	if err != nil {
		return fmt.Errorf("failed to load config: %w", err)
	}

	opts := []validation.Option{validation.WithLocal()}
	if *strict {
		opts = append(opts, validation.WithStrict())
	}

	warnings, err := cfg.ValidateAsClient(m, opts...)
	for _, w := range warnings {
		fmt.Fprintf(os.Stderr, "[WARNING] %s\n", w)
	}

	if err != nil {
		return fmt.Errorf("%s is not valid for %s mode: %w", files[0], m, err)
	}

	fmt.Printf("%s is valid for %s mode\n", files[0], m)

	return nil
}

type patchList []string

func (p *patchList) String() string     { return fmt.Sprint(*p) }
func (p *patchList) Set(v string) error { *p = append(*p, v); return nil }

func patch(args []string) error {
	fs := flag.NewFlagSet("patch", flag.ContinueOnError)

	var patches patchList

	fs.Var(&patches, "patch", "a patch, inline or @file (repeatable)")
	fs.Var(&patches, "p", "short for --patch")
	out := fs.String("o", "", "output file (default stdout)")
	fs.StringVar(out, "output", "", "output file (default stdout)")
	fromEmpty := fs.Bool("from-empty", false, "start from a config holding no document (no FILE)")

	files, err := interleaved(fs, args)
	if err != nil {
		return err
	}

	var input configpatcher.Input

	switch {
	case *fromEmpty && len(files) == 0:
		empty, err := container.New()
		if err != nil {
			return err
		}

		input = configpatcher.WithConfig(empty)
	case !*fromEmpty && len(files) == 1:
		data, err := os.ReadFile(files[0])
		if err != nil {
			return err
		}

		input = configpatcher.WithBytes(data)
	default:
		return errors.New("patch takes one config file, or --from-empty and none")
	}

	loaded, err := configpatcher.LoadPatches(patches)
	if err != nil {
		return err
	}

	applied, err := configpatcher.Apply(input, loaded)
	if err != nil {
		return err
	}

	result, err := applied.Bytes()
	if err != nil {
		return err
	}

	if *out == "" {
		_, err = os.Stdout.Write(result)

		return err
	}

	return os.WriteFile(*out, result, 0o644)
}

// fileFigures is what codec-bench prints per file.
type fileFigures struct {
	File       string  `json:"file"`
	Bytes      int     `json:"bytes"`
	Iterations int     `json:"iterations"`
	ParseNs    float64 `json:"parse_ns"`
	EncodeNs   float64 `json:"encode_ns"`
}

func codecBench(args []string) error {
	fs := flag.NewFlagSet("codec-bench", flag.ContinueOnError)
	iterations := fs.Int("iterations", 100, "loads and encodes per file")

	files, err := interleaved(fs, args)
	if err != nil {
		return err
	}

	if len(files) == 0 || *iterations < 1 {
		return errors.New("codec-bench takes --iterations N (N >= 1) and at least one file")
	}

	figures := make([]fileFigures, 0, len(files))

	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}

		f := fileFigures{File: file, Bytes: len(data), Iterations: *iterations}

		// One untimed round: the first load warms the document registry.
		if _, err = roundTrip(data); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}

		var parse, encode time.Duration

		for range *iterations {
			start := time.Now()

			cfg, err := configloader.NewFromBytes(data)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}

			parsed := time.Now()

			if _, err = cfg.EncodeString(encoder.WithComments(encoder.CommentsDisabled)); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}

			parse += parsed.Sub(start)
			encode += time.Since(parsed)
		}

		f.ParseNs = float64(parse.Nanoseconds()) / float64(*iterations)
		f.EncodeNs = float64(encode.Nanoseconds()) / float64(*iterations)
		figures = append(figures, f)
	}

	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")

	return enc.Encode(figures)
}

func roundTrip(data []byte) (string, error) {
	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return "", err
	}

	return cfg.EncodeString(encoder.WithComments(encoder.CommentsDisabled))
}
