package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetpace/fleetpace/worker"
)

// The worker's probe paths (worker/server.go serves them; they are not
// exported constants, so they are kept here, once, and checked against the
// worker's --help).
const (
	livenessPath  = "/healthz"
	readinessPath = "/readyz"
)

// hardStop is how long a worker waits for cancelled fetches after
// --soft-stop runs out (worker.Run).
const hardStop = 10 * time.Second

// measuredBusyRSS is the largest worker RSS measured for deploy/README.md
// (36 MiB, concurrency 50): memory requests must cover it.
const measuredBusyRSS = 36 << 20

// nonRootUID is the image's user (Containerfile USER).
const nonRootUID = 65532

// k8sObject is the part of a Kubernetes object these tests read.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Replicas *int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		MaxUnavailable    yaml.Node   `yaml:"maxUnavailable"` // a PodDisruptionBudget's: a number or a percentage
		MinAvailable      yaml.Node   `yaml:"minAvailable"`
		Template          podTemplate `yaml:"template"`
		Schedule          string      `yaml:"schedule"`
		ConcurrencyPolicy string      `yaml:"concurrencyPolicy"`
		JobTemplate       struct {
			Spec struct {
				ActiveDeadlineSeconds *int        `yaml:"activeDeadlineSeconds"`
				Template              podTemplate `yaml:"template"`
			} `yaml:"spec"`
		} `yaml:"jobTemplate"`
	} `yaml:"spec"`
	StringData map[string]string `yaml:"stringData"`
	Data       map[string]string `yaml:"data"`
}

type podTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int            `yaml:"terminationGracePeriodSeconds"`
		RestartPolicy                 string          `yaml:"restartPolicy"`
		SecurityContext               securityContext `yaml:"securityContext"`
		Containers                    []container     `yaml:"containers"`
		InitContainers                []container     `yaml:"initContainers"`
	} `yaml:"spec"`
}

type securityContext struct {
	RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
	RunAsUser                *int  `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name     string `yaml:"name"`
				Key      string `yaml:"key"`
				Optional bool   `yaml:"optional"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe  *probe          `yaml:"readinessProbe"`
	LivenessProbe   *probe          `yaml:"livenessProbe"`
	SecurityContext securityContext `yaml:"securityContext"`
	Resources       struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

type probe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

// composeFile is the part of a Compose file these tests read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Deploy struct {
			Replicas *int `yaml:"replicas"`
		} `yaml:"deploy"`
		StopGracePeriod string `yaml:"stop_grace_period"`
		ReadOnly        bool   `yaml:"read_only"`
	} `yaml:"services"`
}

// yamlFiles are every YAML file under deploy/.
func yamlFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// decodeAll decodes every document of a YAML file into a new T.
func decodeAll[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var out []T
	for {
		var v T
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, v)
	}
}

// manifests reads deploy/compose.yaml and every Kubernetes object under
// deploy/kubernetes/, failing on any YAML file under deploy/ that does not
// parse.
func manifests(t *testing.T) (composeFile, map[string]k8sObject) {
	t.Helper()
	var compose composeFile
	objects := map[string]k8sObject{} // kind/name → object
	for _, p := range yamlFiles(t) {
		switch {
		case p == "compose.yaml":
			docs, err := decodeAll[composeFile](p)
			if err != nil || len(docs) != 1 {
				t.Fatalf("%s: %v (%d documents)", p, err, len(docs))
			}
			compose = docs[0]
		case strings.HasPrefix(p, "kubernetes/"):
			docs, err := decodeAll[k8sObject](p)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range docs {
				if o.Kind == "" || o.APIVersion == "" || o.Metadata.Name == "" {
					t.Errorf("%s: a document without kind, apiVersion or name", p)
				}
				objects[o.Kind+"/"+o.Metadata.Name] = o
			}
		default:
			if _, err := decodeAll[yaml.Node](p); err != nil {
				t.Error(err)
			}
		}
	}
	if len(compose.Services) == 0 {
		t.Fatal("compose.yaml has no services")
	}
	return compose, objects
}

// help is `fleetpace ARGS… --help`; it fails the test unless the command
// exists and takes the flags given.
func help(t *testing.T, args []string) string {
	t.Helper()
	out, err := exec.Command(binary, append(append([]string{}, args...), "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("fleetpace %s --help: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// checkCommand checks that args name a real fleetpace command (not a
// command group with a stray word after it) whose flags exist, and returns
// its help.
func checkCommand(t *testing.T, where string, args []string) string {
	t.Helper()
	var words []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		words = append(words, a)
	}
	if len(words) == 0 {
		t.Fatalf("%s: no fleetpace command in %q", where, args)
	}
	h := help(t, args)
	want := "fleetpace " + strings.Join(words, " ") + " [flags]"
	if !regexp.MustCompile(`(?m)^Usage:\n\s+` + regexp.QuoteMeta(want)).MatchString(h) {
		t.Errorf("%s: %q is not a fleetpace command (its help has no usage line %q)", where, strings.Join(words, " "), want)
	}
	return h
}

// flagDefault is a flag's default as --help prints it ("" when none).
func flagDefault(h, flag string) string {
	m := regexp.MustCompile(`(?m)^\s+--` + regexp.QuoteMeta(flag) + ` .*\(default "?([^")]*)"?\)$`).FindStringSubmatch(h)
	if m == nil {
		return ""
	}
	return m[1]
}

// setting resolves a flag as the running container sees it: its command
// line, then its FLEETPACE_ variable, then the image's environment, then
// the default in --help.
func setting(args []string, env, imageEnv map[string]string, h, flag string) string {
	if v, ok := execFlags(strings.Join(args, " "))[flag]; ok {
		return v
	}
	name := "FLEETPACE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
	if v, ok := env[name]; ok {
		return v
	}
	if v, ok := imageEnv[name]; ok {
		return v
	}
	return flagDefault(h, flag)
}

// checkEnvNames checks that every FLEETPACE_ variable given to a command is
// one it reads (its --help names it), so a misspelt variable cannot be
// silently ignored.
func checkEnvNames(t *testing.T, where string, env map[string]string, h string) {
	t.Helper()
	for name := range env {
		if strings.HasPrefix(name, "FLEETPACE_") && !strings.Contains(h, "[env "+name) {
			t.Errorf("%s: %s is not a variable this command reads", where, name)
		}
	}
}

// containerfile is what the tests read of ../Containerfile.
type containerfileInfo struct {
	user   string
	env    map[string]string
	expose []string
}

func readContainerfile(t *testing.T) containerfileInfo {
	t.Helper()
	f, err := os.Open("../Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := containerfileInfo{env: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "USER":
			c.user = fields[1]
		case "ENV":
			for _, kv := range fields[1:] {
				k, v, _ := strings.Cut(kv, "=")
				c.env[k] = v
			}
		case "EXPOSE":
			c.expose = append(c.expose, fields[1:]...)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return c
}

// workerPort is the port of the worker's default HTTP address.
func workerPort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(worker.DefaultHTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// defaultImage is deploy/build-image's default IMAGE.
func defaultImage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("build-image")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`IMAGE=\$\{IMAGE:-([^}]+)\}`).FindSubmatch(b)
	if m == nil {
		t.Fatal("build-image: no IMAGE=${IMAGE:-…} default")
	}
	return string(m[1])
}

// TestProbePathsAreTheWorkers: the probe paths kept here are the ones the
// worker says it serves.
func TestProbePathsAreTheWorkers(t *testing.T) {
	h := help(t, []string{"worker"})
	for _, p := range []string{livenessPath, readinessPath} {
		if !strings.Contains(h, p) {
			t.Errorf("fleetpace worker --help does not mention %s", p)
		}
	}
}

// TestContainerfile checks the image definition against the worker's
// defaults: non-root numeric user, the worker's port on every interface,
// SIGTERM, worker by default, nothing pulled.
func TestContainerfile(t *testing.T) {
	b, err := os.ReadFile("../Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{
		"\nFROM scratch\n",
		"\nSTOPSIGNAL SIGTERM\n",
		"\nENTRYPOINT [\"/fleetpace\"]\n",
		"\nCMD [\"worker\"]\n",
		"COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Containerfile lacks %q", strings.TrimSpace(want))
		}
	}
	if n := strings.Count(text, "\nFROM "); n != 1 {
		t.Errorf("Containerfile has %d FROM lines, want only FROM scratch", n)
	}
	c := readContainerfile(t)
	if c.user != fmt.Sprintf("%d:%d", nonRootUID, nonRootUID) {
		t.Errorf("USER %q, want %d:%d", c.user, nonRootUID, nonRootUID)
	}
	port := workerPort(t)
	if got := c.env["FLEETPACE_HTTP_ADDR"]; got != "0.0.0.0:"+port {
		t.Errorf("ENV FLEETPACE_HTTP_ADDR=%q, want 0.0.0.0:%s (the worker's port, every interface)", got, port)
	}
	if len(c.expose) != 1 || c.expose[0] != port {
		t.Errorf("EXPOSE %v, want %s", c.expose, port)
	}
}

// TestManifests parses every YAML file under deploy/ and checks, in the
// Compose file and the Kubernetes objects, what a fleet depends on.
func TestManifests(t *testing.T) {
	compose, objects := manifests(t)
	image := defaultImage(t)
	img := readContainerfile(t)
	port := workerPort(t)
	workerHelp := help(t, []string{"worker"})
	soft, err := time.ParseDuration(flagDefault(workerHelp, "soft-stop"))
	if err != nil {
		t.Fatalf("worker --soft-stop default: %v", err)
	}
	t.Logf("worker defaults: --http-addr port %s, --soft-stop %s (+%s hard stop); image %s", port, soft, hardStop, image)

	// checkHTTPAddr: a worker in a container listens on every interface, on
	// the port its probes and ports use.
	checkHTTPAddr := func(where, addr string) {
		host, p, err := net.SplitHostPort(addr)
		if err != nil || (host != "0.0.0.0" && host != "" && host != "::") || p != port {
			t.Errorf("%s: --http-addr %q, want 0.0.0.0:%s (probes reach the pod's address, not its loopback)", where, addr, port)
		}
	}
	checkGrace := func(where string, grace time.Duration, args []string, env map[string]string, h string) {
		s, err := time.ParseDuration(setting(args, env, img.env, h, "soft-stop"))
		if err != nil {
			t.Errorf("%s: --soft-stop: %v", where, err)
			return
		}
		if grace <= s+hardStop {
			t.Errorf("%s: grace period %s must exceed --soft-stop %s + the %s hard stop", where, grace, s, hardStop)
		}
	}

	// Compose.
	fleetImages, workers := 0, 0
	for name, svc := range compose.Services {
		where := "compose.yaml: " + name
		if !strings.Contains(svc.Image, "fleetpace") {
			continue
		}
		fleetImages++
		if svc.Image != image {
			t.Errorf("%s: image %q, want %q (deploy/build-image's)", where, svc.Image, image)
		}
		args := svc.Command
		if len(args) == 0 {
			args = []string{"worker"} // the image's CMD
		}
		h := checkCommand(t, where, args)
		checkEnvNames(t, where, svc.Environment, h)
		if svc.Environment["DATABASE_URL"] == "" && svc.Environment["FLEETPACE_DATABASE_URL"] == "" {
			t.Errorf("%s: no DATABASE_URL (the image has no embedded PostgreSQL)", where)
		}
		if !svc.ReadOnly && args[0] == "worker" {
			t.Errorf("%s: worker without read_only: true", where)
		}
		switch args[0] {
		case "schema":
			if c := svc.DependsOn["postgres"].Condition; c != "service_healthy" {
				t.Errorf("%s: depends on postgres with %q, want service_healthy", where, c)
			}
			if pg, ok := compose.Services["postgres"]; !ok || pg.Healthcheck == nil || len(pg.Healthcheck.Test) == 0 {
				t.Errorf("compose.yaml: postgres has no healthcheck for the schema service to wait on")
			}
		case "worker":
			n := 1
			if svc.Deploy.Replicas != nil {
				n = *svc.Deploy.Replicas
			}
			workers += n
			if c := svc.DependsOn["schema"].Condition; c != "service_completed_successfully" {
				t.Errorf("%s: depends on schema with %q, want service_completed_successfully", where, c)
			}
			checkHTTPAddr(where, setting(args, svc.Environment, img.env, h, "http-addr"))
			for _, p := range svc.Ports {
				parts := strings.Split(p, ":")
				if parts[len(parts)-1] != port || !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("%s: port %q, want 127.0.0.1::%s (loopback only)", where, p, port)
				}
			}
			grace, err := time.ParseDuration(svc.StopGracePeriod)
			if err != nil {
				t.Errorf("%s: stop_grace_period %q: %v", where, svc.StopGracePeriod, err)
			} else {
				checkGrace(where, grace, args, svc.Environment, h)
			}
		}
	}
	if fleetImages < 2 || workers != 3 {
		t.Errorf("compose.yaml: %d fleetpace services and %d workers, want a schema service and 3 workers", fleetImages, workers)
	}

	// Kubernetes.
	secret, ok := objects["Secret/fleetpace-database"]
	if !ok || (secret.StringData["DATABASE_URL"] == "" && secret.Data["DATABASE_URL"] == "") {
		t.Fatal("kubernetes: no Secret fleetpace-database with DATABASE_URL")
	}
	kinds := map[string]int{}
	for key, o := range objects {
		var pod podTemplate
		switch o.Kind {
		case "Deployment", "Job":
			pod = o.Spec.Template
		case "CronJob":
			pod = o.Spec.JobTemplate.Spec.Template
		default:
			continue
		}
		kinds[o.Kind]++
		ps := pod.Spec
		for _, c := range append(ps.InitContainers, ps.Containers...) {
			where := "kubernetes " + key + " container " + c.Name
			if c.Image != image {
				t.Errorf("%s: image %q, want %q (deploy/build-image's, as in compose.yaml)", where, c.Image, image)
			}
			if len(c.Command) > 0 {
				t.Errorf("%s: command overrides the image's entrypoint; give args", where)
			}
			args := c.Args
			if len(args) == 0 {
				args = []string{"worker"}
			}
			h := checkCommand(t, where, args)
			env := map[string]string{}
			hasURL := false
			for _, e := range c.Env {
				env[e.Name] = e.Value
				if e.Name == "DATABASE_URL" || e.Name == "FLEETPACE_DATABASE_URL" {
					ref := e.ValueFrom
					hasURL = ref != nil && ref.SecretKeyRef != nil && ref.SecretKeyRef.Name == secret.Metadata.Name && ref.SecretKeyRef.Key == "DATABASE_URL"
				}
			}
			checkEnvNames(t, where, env, h)
			if !hasURL {
				t.Errorf("%s: DATABASE_URL does not come from Secret %s", where, secret.Metadata.Name)
			}
			// Non-root, read-only root file system, no privilege escalation.
			nonRoot := c.SecurityContext.RunAsNonRoot
			if nonRoot == nil {
				nonRoot = ps.SecurityContext.RunAsNonRoot
			}
			uid := c.SecurityContext.RunAsUser
			if uid == nil {
				uid = ps.SecurityContext.RunAsUser
			}
			if nonRoot == nil || !*nonRoot || (uid != nil && *uid != nonRootUID) {
				t.Errorf("%s: want runAsNonRoot: true (and the image's user %d)", where, nonRootUID)
			}
			if p := c.SecurityContext.ReadOnlyRootFilesystem; p == nil || !*p {
				t.Errorf("%s: want readOnlyRootFilesystem: true", where)
			}
			if p := c.SecurityContext.AllowPrivilegeEscalation; p == nil || *p {
				t.Errorf("%s: want allowPrivilegeEscalation: false", where)
			}
			if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
				t.Errorf("%s: want cpu and memory requests and a memory limit", where)
			}
			switch args[0] {
			case "worker":
				checkWorkerContainer(t, where, c, pod, port, setting(args, env, img.env, h, "http-addr"), checkHTTPAddr)
				if g := ps.TerminationGracePeriodSeconds; g == nil {
					t.Errorf("%s: no terminationGracePeriodSeconds", where)
				} else {
					checkGrace(where, time.Duration(*g)*time.Second, args, env, h)
				}
			case "scan":
				if o.Kind != "CronJob" {
					break
				}
				if o.Spec.ConcurrencyPolicy != "Forbid" {
					t.Errorf("%s: concurrencyPolicy %q, want Forbid", where, o.Spec.ConcurrencyPolicy)
				}
				period := cronPeriod(t, o.Spec.Schedule)
				if d := o.Spec.JobTemplate.Spec.ActiveDeadlineSeconds; d == nil || time.Duration(*d)*time.Second >= period {
					t.Errorf("%s: activeDeadlineSeconds must be shorter than the schedule's period %s", where, period)
				}
				la, err := time.ParseDuration(setting(args, env, img.env, h, "look-ahead"))
				if err != nil || la < period {
					t.Errorf("%s: --look-ahead %s shorter than the schedule's period %s: every platform would get less than its ceiling", where, la, period)
				}
			}
		}
	}
	for _, k := range []string{"Deployment", "Job", "CronJob"} {
		if kinds[k] == 0 {
			t.Errorf("kubernetes: no %s", k)
		}
	}
	checkWorkerDeployment(t, objects)
}

// checkWorkerDeployment checks what the worker Deployment needs around its
// pods: the schema applied by an init step, the admin token from a Secret
// of the manifests (never a literal), and a PodDisruptionBudget that
// selects its pods and lets a drain evict one at a time.
func checkWorkerDeployment(t *testing.T, objects map[string]k8sObject) {
	t.Helper()
	d, ok := objects["Deployment/fleetpace-worker"]
	if !ok {
		t.Fatal("kubernetes: no Deployment fleetpace-worker")
	}
	ps := d.Spec.Template.Spec
	schema := false
	for _, c := range ps.InitContainers {
		schema = schema || strings.Join(c.Args, " ") == "schema apply"
	}
	if !schema {
		t.Errorf("kubernetes: the worker Deployment has no init container running `schema apply`")
	}
	for _, c := range ps.Containers {
		token := false
		for _, e := range c.Env {
			if e.Name != "FLEETPACE_ADMIN_TOKEN" {
				continue
			}
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("kubernetes: worker container %s: FLEETPACE_ADMIN_TOKEN must come from a Secret, not a literal", c.Name)
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			sec, ok := objects["Secret/"+ref.Name]
			_, inString := sec.StringData[ref.Key]
			_, inData := sec.Data[ref.Key]
			token = ok && (inString || inData)
			if !token {
				t.Errorf("kubernetes: worker container %s: FLEETPACE_ADMIN_TOKEN from Secret %s key %s, which the manifests do not define", c.Name, ref.Name, ref.Key)
			}
		}
		if !token {
			t.Errorf("kubernetes: worker container %s: no FLEETPACE_ADMIN_TOKEN from a Secret (the dashboard's actions and River UI need it)", c.Name)
		}
	}
	var pdbs []k8sObject
	for _, o := range objects {
		if o.Kind == "PodDisruptionBudget" {
			pdbs = append(pdbs, o)
		}
	}
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	found := false
	for _, pdb := range pdbs {
		sel := pdb.Spec.Selector.MatchLabels
		selects := len(sel) > 0
		for k, v := range sel {
			selects = selects && d.Spec.Template.Metadata.Labels[k] == v
		}
		if !selects {
			continue
		}
		found = true
		switch {
		case pdb.Spec.MaxUnavailable.Kind != 0:
			if n, err := strconv.Atoi(pdb.Spec.MaxUnavailable.Value); err != nil || n < 1 || n >= replicas {
				t.Errorf("kubernetes: PodDisruptionBudget %s: maxUnavailable %q, want a number in [1, %d)", pdb.Metadata.Name, pdb.Spec.MaxUnavailable.Value, replicas)
			}
		case pdb.Spec.MinAvailable.Kind != 0:
			if n, err := strconv.Atoi(pdb.Spec.MinAvailable.Value); err != nil || n < 1 || n >= replicas {
				t.Errorf("kubernetes: PodDisruptionBudget %s: minAvailable %q, want a number in [1, %d)", pdb.Metadata.Name, pdb.Spec.MinAvailable.Value, replicas)
			}
		default:
			t.Errorf("kubernetes: PodDisruptionBudget %s sets neither maxUnavailable nor minAvailable", pdb.Metadata.Name)
		}
	}
	if !found {
		t.Errorf("kubernetes: no PodDisruptionBudget selects the worker Deployment's pods (labels %v)", d.Spec.Template.Metadata.Labels)
	}
}

// checkWorkerContainer checks a worker container's port and probes.
func checkWorkerContainer(t *testing.T, where string, c container, pod podTemplate, port, httpAddr string, checkHTTPAddr func(string, string)) {
	t.Helper()
	checkHTTPAddr(where, httpAddr)
	names := map[string]string{}
	found := false
	for _, p := range c.Ports {
		names[p.Name] = strconv.Itoa(p.ContainerPort)
		found = found || strconv.Itoa(p.ContainerPort) == port
	}
	if !found {
		t.Errorf("%s: no containerPort %s", where, port)
	}
	for _, pr := range []struct {
		kind, path string
		p          *probe
	}{{"readinessProbe", readinessPath, c.ReadinessProbe}, {"livenessProbe", livenessPath, c.LivenessProbe}} {
		if pr.p == nil || pr.p.HTTPGet == nil {
			t.Errorf("%s: no %s httpGet", where, pr.kind)
			continue
		}
		got := pr.p.HTTPGet.Port.Value
		if n, ok := names[got]; ok {
			got = n
		}
		if pr.p.HTTPGet.Path != pr.path || got != port {
			t.Errorf("%s: %s GET %s on port %s, want %s on %s", where, pr.kind, pr.p.HTTPGet.Path, got, pr.path, port)
		}
	}
	if p := pod.Metadata.Annotations["prometheus.io/port"]; p != "" && p != port {
		t.Errorf("%s: prometheus.io/port %q, want %s", where, p, port)
	}
	if q, err := parseQuantity(c.Resources.Requests["memory"]); err != nil || q < measuredBusyRSS {
		t.Errorf("%s: memory request %q (%v) below the measured busy worker's %d MiB", where, c.Resources.Requests["memory"], err, measuredBusyRSS>>20)
	}
}

// cronPeriod is the period of a schedule of the forms "* * * * *" and
// "*/N * * * *".
func cronPeriod(t *testing.T, schedule string) time.Duration {
	t.Helper()
	f := strings.Fields(schedule)
	if len(f) != 5 {
		t.Fatalf("schedule %q: want five fields", schedule)
	}
	switch {
	case f[0] == "*":
		return time.Minute
	case strings.HasPrefix(f[0], "*/"):
		n, err := strconv.Atoi(f[0][2:])
		if err == nil && n > 0 {
			return time.Duration(n) * time.Minute
		}
	}
	t.Fatalf("schedule %q: only every-N-minutes schedules are checked", schedule)
	return 0
}

// parseQuantity reads a Kubernetes memory quantity in bytes (Ki/Mi/Gi or a
// plain number).
func parseQuantity(s string) (int64, error) {
	for suffix, mult := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v * mult, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}
