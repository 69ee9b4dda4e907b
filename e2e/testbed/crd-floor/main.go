// crd-floor validates CRD manifests with the CRD validation code of the Kubernetes release this
// module pins (k8s.io/apiextensions-apiserver at the chart's kubeVersion floor): the same
// ValidateCustomResourceDefinition an API server of that release runs on `kubectl apply`,
// including the compilation and cost estimation of every CEL rule against that release's CEL
// environment. No API server and no etcd: the check is the validation function itself.
//
// Usage: crd-floor FILE.yaml...   (exit 1 listing every error; prints the release it checked)
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

func release() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/apiextensions-apiserver" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// check validates every CRD of one multi-document YAML file; it returns the error lines.
func check(path string, scheme *runtime.Scheme) ([]string, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	decode := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufioReader(data))
	var problems []string
	n := 0
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		} else if err != nil {
			return nil, n, err
		}
		if onlyComments(doc) {
			continue
		}
		obj, _, err := decode.Decode(doc, nil, nil)
		if err != nil {
			return nil, n, fmt.Errorf("%s: %w", path, err)
		}
		v1crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			return nil, n, fmt.Errorf("%s: a %T, not a CustomResourceDefinition", path, obj)
		}
		scheme.Default(v1crd)
		var crd apiextensions.CustomResourceDefinition
		if err := scheme.Convert(v1crd, &crd, nil); err != nil {
			return nil, n, err
		}
		n++
		for _, e := range validation.ValidateCustomResourceDefinition(context.Background(), &crd) {
			problems = append(problems, fmt.Sprintf("%s: %s", crd.Name, e.Error()))
		}
	}
	return problems, n, nil
}

// onlyComments: a document of blank and comment lines (the file's header) holds no object.
func onlyComments(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

func main() {
	scheme := runtime.NewScheme()
	if err := apiextensions.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	failed := false
	for _, path := range os.Args[1:] {
		problems, n, err := check(path, scheme)
		if err != nil {
			fmt.Fprintln(os.Stderr, "crd-floor:", err)
			os.Exit(2)
		}
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "crd-floor:", p)
			failed = true
		}
		fmt.Printf("crd-floor: %s: %d CRDs checked with k8s.io/apiextensions-apiserver %s, %d problems\n", path, n, release(), len(problems))
	}
	if failed {
		os.Exit(1)
	}
}
