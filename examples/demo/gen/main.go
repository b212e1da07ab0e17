//go:build ignore

// Command gen writes the demo dataset deterministically:
//
//	go run examples/demo/gen/main.go [-out examples/demo/data]
//
// glaive_fc.jsonl holds 300 glaive-function-calling-style rows (a system
// prompt with glaive's "SYSTEM: " prefix, tools as a JSON string, ShareGPT
// turns: single questions, recorded tool round trips with a follow-up, and
// chats of two or three exchanges) plus 3 deliberately bad rows, so the demo
// shows dead letters with file:line. opencode.parquet holds
// 300 OpenCodeInstruct-style rows (id, input), some of them 3-6k characters.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/parquet-go/parquet-go"
)

func main() {
	out := flag.String("out", "examples/demo/data", "directory to write the files into")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}
	if err := writeGlaive(filepath.Join(*out, "glaive_fc.jsonl")); err != nil {
		log.Fatal(err)
	}
	if err := writeOpenCode(filepath.Join(*out, "opencode.parquet")); err != nil {
		log.Fatal(err)
	}
}

// ---- glaive function calling ----

type param struct {
	Name, Type, Desc string
	Enum             []string
	Required         bool
}

type tool struct {
	Name, Desc string
	Params     []param
	// Asks are user requests that need this tool; %s slots take values from Fill.
	Asks []string
	Fill [][]string
	// Call and Result are a function call and its observation for multi-turn rows.
	Call, Result func(args []string) string
}

func (t tool) schema() map[string]any {
	props := map[string]any{}
	var req []string
	for _, p := range t.Params {
		prop := map[string]any{"type": p.Type, "description": p.Desc}
		if len(p.Enum) > 0 {
			prop["enum"] = p.Enum
		}
		props[p.Name] = prop
		if p.Required {
			req = append(req, p.Name)
		}
	}
	params := map[string]any{"type": "object", "properties": props}
	if len(req) > 0 {
		params["required"] = req
	}
	return map[string]any{"name": t.Name, "description": t.Desc, "parameters": params}
}

var tools = []tool{{
	Name: "get_current_weather", Desc: "Get the current weather in a given location",
	Params: []param{{"location", "string", "The city and country, e.g. Paris, France", nil, true}, {"unit", "string", "Temperature unit", []string{"celsius", "fahrenheit"}, false}},
	Asks: []string{
		"What's the weather like in %s right now?",
		"Can you check the current weather in %s? I'm deciding whether to bring an umbrella.",
		"I'm flying to %s tomorrow morning for a conference and I have no idea what to pack. Could you tell me what the weather is like there at the moment, in %s please?",
	},
	Fill: [][]string{{"Oslo, Norway", "celsius"}, {"Austin, Texas", "fahrenheit"}, {"Kyoto, Japan", "celsius"}, {"Cape Town, South Africa", "celsius"}, {"Denver, Colorado", "fahrenheit"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "get_current_weather", "arguments": {"location": %q}}`, a[0])
	},
	Result: func(a []string) string {
		return fmt.Sprintf(`{"location": %q, "temperature": 14, "condition": "light rain", "humidity": 82}`, a[0])
	},
}, {
	Name: "convert_currency", Desc: "Convert an amount from one currency to another",
	Params: []param{{"amount", "number", "The amount to convert", nil, true}, {"from_currency", "string", "ISO code of the source currency", nil, true}, {"to_currency", "string", "ISO code of the target currency", nil, true}},
	Asks: []string{
		"How much is %s %s in %s?",
		"I need to convert %s %s to %s for an invoice.",
		"My landlord abroad wants the rent in local currency. I have %s %s set aside; how much is that in %s at today's rate? Please be precise, the contract says we use the daily rate.",
	},
	Fill: [][]string{{"500", "USD", "EUR"}, {"1200", "GBP", "JPY"}, {"75.50", "CAD", "USD"}, {"20000", "INR", "AUD"}, {"3400", "CHF", "SEK"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "convert_currency", "arguments": {"amount": %s, "from_currency": %q, "to_currency": %q}}`, a[0], a[1], a[2])
	},
	Result: func(a []string) string { return `{"converted_amount": 461.35, "rate": 0.9227}` },
}, {
	Name: "create_calendar_event", Desc: "Create a new event in the user's calendar",
	Params: []param{{"title", "string", "Title of the event", nil, true}, {"start_time", "string", "Start time in ISO 8601", nil, true}, {"end_time", "string", "End time in ISO 8601", nil, true}, {"attendees", "array", "Email addresses of attendees", nil, false}},
	Asks: []string{
		"Schedule a meeting called '%s' on %s.",
		"Please put '%s' in my calendar for %s and invite the usual team.",
		"I keep forgetting things. Could you create an event titled '%s' for %s? It should last an hour, and remind me that I need to bring the printed slides and the budget numbers from last quarter.",
	},
	Fill: [][]string{{"Quarterly review", "2024-05-14 at 10:00"}, {"Dentist", "next Tuesday at 15:30"}, {"Project kickoff", "2024-06-03 at 09:00"}, {"1:1 with Priya", "Friday at 14:00"}, {"Book club", "2024-07-21 at 19:00"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "create_calendar_event", "arguments": {"title": %q, "start_time": "2024-05-14T10:00:00", "end_time": "2024-05-14T11:00:00"}}`, a[0])
	},
	Result: func(a []string) string {
		return fmt.Sprintf(`{"status": "created", "event_id": "evt_4821", "title": %q}`, a[0])
	},
}, {
	Name: "get_stock_price", Desc: "Get the latest stock price for a ticker symbol",
	Params: []param{{"symbol", "string", "The stock ticker, e.g. AAPL", nil, true}},
	Asks: []string{
		"What's the current price of %s?",
		"Can you look up %s stock for me?",
		"I'm thinking about rebalancing my portfolio before the end of the month. What is %s trading at right now, and is that above or below where it was last week?",
	},
	Fill: [][]string{{"AAPL"}, {"MSFT"}, {"NVDA"}, {"TSLA"}, {"ASML"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "get_stock_price", "arguments": {"symbol": %q}}`, a[0])
	},
	Result: func(a []string) string {
		return fmt.Sprintf(`{"symbol": %q, "price": 187.42, "currency": "USD"}`, a[0])
	},
}, {
	Name: "calculate_loan_payment", Desc: "Calculate the monthly payment of a loan",
	Params: []param{{"principal", "number", "The loan amount", nil, true}, {"interest_rate", "number", "Annual interest rate in percent", nil, true}, {"term_months", "integer", "Loan term in months", nil, true}},
	Asks: []string{
		"What would my monthly payment be on a %s loan at %s%% over %s months?",
		"I'm looking at a car loan: %s borrowed, %s%% interest, %s months. What's the monthly payment?",
	},
	Fill: [][]string{{"25000", "4.5", "60"}, {"300000", "6.1", "360"}, {"8000", "9.9", "24"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "calculate_loan_payment", "arguments": {"principal": %s, "interest_rate": %s, "term_months": %s}}`, a[0], a[1], a[2])
	},
	Result: func(a []string) string { return `{"monthly_payment": 466.08}` },
}, {
	Name: "search_recipes", Desc: "Search recipes by ingredients",
	Params: []param{{"ingredients", "array", "Ingredients to include", nil, true}, {"diet", "string", "Dietary restriction", []string{"none", "vegetarian", "vegan", "gluten-free"}, false}},
	Asks: []string{
		"I have %s in the fridge. What can I cook?",
		"Find me a recipe using %s. I'm trying to eat less meat, so vegetarian would be ideal.",
	},
	Fill: [][]string{{"chickpeas, spinach and lemons"}, {"tofu and broccoli"}, {"eggs, leeks and goat cheese"}},
	Call: func(a []string) string {
		return `{"name": "search_recipes", "arguments": {"ingredients": ["chickpeas", "spinach"]}}`
	},
	Result: func(a []string) string {
		return `{"recipes": [{"name": "Chickpea and spinach stew", "time_minutes": 35}]}`
	},
}, {
	Name: "translate_text", Desc: "Translate text between languages",
	Params: []param{{"text", "string", "Text to translate", nil, true}, {"source_language", "string", "Language of the text", nil, false}, {"target_language", "string", "Language to translate into", nil, true}},
	Asks: []string{
		"Translate '%s' into %s.",
		"How do I say '%s' in %s? It's for a sign in our shop window.",
	},
	Fill: [][]string{{"Where is the train station?", "German"}, {"We are closed on Sundays", "Spanish"}, {"Thank you for your patience", "Japanese"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "translate_text", "arguments": {"text": %q, "target_language": %q}}`, a[0], a[1])
	},
	Result: func(a []string) string { return `{"translated_text": "Wo ist der Bahnhof?"}` },
}, {
	Name: "calculate_bmi", Desc: "Calculate the Body Mass Index",
	Params: []param{{"weight_kg", "number", "Weight in kilograms", nil, true}, {"height_m", "number", "Height in meters", nil, true}},
	Asks:   []string{"I weigh %s kg and I'm %s m tall. What's my BMI?"},
	Fill:   [][]string{{"72", "1.80"}, {"58", "1.62"}, {"95", "1.75"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "calculate_bmi", "arguments": {"weight_kg": %s, "height_m": %s}}`, a[0], a[1])
	},
	Result: func(a []string) string { return `{"bmi": 22.2}` },
}, {
	Name: "get_news_headlines", Desc: "Get the latest news headlines",
	Params: []param{{"country", "string", "Country code", nil, false}, {"category", "string", "News category", []string{"business", "technology", "sports", "science"}, false}},
	Asks:   []string{"What are the latest %s headlines in %s?", "Give me today's top %s news for %s."},
	Fill:   [][]string{{"technology", "the US"}, {"sports", "the UK"}, {"science", "Germany"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "get_news_headlines", "arguments": {"category": %q}}`, a[0])
	},
	Result: func(a []string) string {
		return `{"headlines": ["Chipmaker posts record quarter", "New battery chemistry passes safety tests"]}`
	},
}, {
	Name: "generate_password", Desc: "Generate a random password",
	Params: []param{{"length", "integer", "Length of the password", nil, true}, {"include_symbols", "boolean", "Whether to include symbols", nil, false}},
	Asks:   []string{"I need a new password, %s characters long.", "Generate a %s-character password with symbols for my bank account."},
	Fill:   [][]string{{"16"}, {"24"}, {"12"}},
	Call: func(a []string) string {
		return fmt.Sprintf(`{"name": "generate_password", "arguments": {"length": %s}}`, a[0])
	},
	Result: func(a []string) string { return `{"password": "q7#Lm2!vRx9@Tb4p"}` },
}}

// offTopic asks need none of the row's tools: the assistant must answer on its own.
var offTopic = []string{
	"Can you explain the difference between a virus and a bacterium?",
	"Write a haiku about autumn.",
	"What is the capital of Australia?",
	"Can you order a pizza for me?",
	"I have been feeling unmotivated at work lately. Do you have any practical advice for getting through long afternoons without burning out, especially on days full of meetings?",
	"Tell me a fun fact about octopuses.",
}

// chatFollowUps continue a conversation that needs no tool.
var chatFollowUps = []string{
	"Could you explain that in simpler terms?",
	"Thanks! Can you give me one more example?",
	"Interesting. What is the most common misconception about it?",
}

var followUps = []string{
	"Thanks! And what about tomorrow?",
	"Great, can you do the same for another one?",
	"Perfect. Could you summarise that in one sentence?",
	"Thanks. Is that a good deal compared to last month?",
}

const glaiveSystem = "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required."

type turn struct {
	From  string `json:"from"`
	Value string `json:"value"`
}

type glaiveRow struct {
	ID            string `json:"id"`
	System        string `json:"system"`
	Tools         string `json:"tools"`
	Conversations []turn `json:"conversations"`
}

func fill(t tool, r *rand.Rand) (string, []string) {
	ask := t.Asks[r.IntN(len(t.Asks))]
	args := t.Fill[r.IntN(len(t.Fill))]
	n := strings.Count(ask, "%s")
	vals := make([]any, n)
	for i := range vals {
		vals[i] = args[i%len(args)]
	}
	return fmt.Sprintf(ask, vals...), args
}

func writeGlaive(path string) error {
	r := rand.New(rand.NewPCG(2024, 1))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	// Bad rows go after these good rows (1-based): lines 43, 138 and 253.
	bad := map[int]string{
		42:  `{"id":"glaive-bad-1","system":"` + glaiveSystem + `","tools":"[]","conversations":[{"from":"human","value":"This line is cut off`,
		136: `{"id":"glaive-bad-2","system":"` + glaiveSystem + `","tools":"","conversations":"USER: What's the weather in Rome? ASSISTANT: Let me check."}`,
		250: `{"system":"` + glaiveSystem + `","tools":"","conversations":[{"from":"human","value":"This row has no id."}]}`,
	}
	for i := 1; i <= 300; i++ {
		// One to three tools per row; the first is the one the user needs.
		main := tools[r.IntN(len(tools))]
		chosen := []tool{main}
		for extra := r.IntN(3); extra > 0; extra-- {
			t := tools[r.IntN(len(tools))]
			if t.Name != main.Name && t.Name != chosen[len(chosen)-1].Name {
				chosen = append(chosen, t)
			}
		}
		var schemas []any
		for j, t := range chosen {
			s := t.schema()
			if i%10 == 0 && j == 0 { // some rows use the wrapped OpenAI shape
				schemas = append(schemas, map[string]any{"type": "function", "function": s})
			} else {
				schemas = append(schemas, s)
			}
		}
		toolsJSON, err := json.MarshalIndent(schemas, "", "    ")
		if err != nil {
			return err
		}
		row := glaiveRow{ID: fmt.Sprintf("glaive-%05d", i), System: glaiveSystem, Tools: string(toolsJSON)}
		ask, args := fill(main, r)
		switch k := r.IntN(20); {
		case k < 2: // no tools at all: a chat of two or three exchanges, every answer regenerated
			row.Tools = ""
			row.Conversations = []turn{{"human", offTopic[r.IntN(len(offTopic))]}, {"gpt", "Here is a short answer."},
				{"human", chatFollowUps[r.IntN(len(chatFollowUps))]}, {"gpt", "Of course."}}
			if r.IntN(2) == 0 {
				row.Conversations = append(row.Conversations, turn{"human", chatFollowUps[r.IntN(len(chatFollowUps))]})
			}
		case k < 4: // tools present but not useful
			row.Conversations = []turn{{"human", offTopic[r.IntN(len(offTopic))]}}
		case k < 7: // a full tool round trip, then a follow-up question: the recorded
			// tool result is kept only if the model makes the same call
			row.Conversations = []turn{
				{"human", ask},
				{"function_call", main.Call(args)},
				{"observation", main.Result(args)},
				{"gpt", "Here is what I found: " + main.Result(args)},
				{"human", followUps[r.IntN(len(followUps))]},
			}
		case k < 9: // an old answer that regen replaces with the model's own
			row.Conversations = []turn{{"human", ask}, {"gpt", "Let me look that up for you."}}
		default:
			row.Conversations = []turn{{"human", ask}}
		}
		b, err := json.Marshal(row)
		if err != nil {
			return err
		}
		w.Write(b)
		w.WriteByte('\n')
		if line, ok := bad[i]; ok {
			w.WriteString(line + "\n")
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// ---- OpenCodeInstruct-style coding tasks ----

type codeRow struct {
	ID    string `parquet:"id"`
	Input string `parquet:"input"`
}

var (
	langs = []string{"Python", "Go", "Rust", "TypeScript", "Java", "C++"}
	tasks = []string{
		"Write a function `%s` that returns the longest palindromic substring of a string.",
		"Implement a function `%s` that merges two sorted lists into one sorted list without using the built-in sort.",
		"Write a function `%s` that checks whether a binary tree is height-balanced.",
		"Implement an LRU cache class with `get` and `put` in O(1) time; expose the constructor as `%s`.",
		"Write a function `%s` that parses a CSV line, honouring quoted fields that contain commas and escaped quotes.",
		"Implement `%s`, which returns the k most frequent words in a text, ties broken alphabetically.",
		"Write a function `%s` that computes the edit distance between two strings.",
		"Implement a rate limiter `%s` that allows at most N calls per rolling window of W seconds.",
		"Write `%s`, a function that validates an IPv4 address given as a string.",
		"Implement `%s`, which flattens an arbitrarily nested list of integers.",
	}
	names       = []string{"solve", "longest_run", "merge_sorted", "is_balanced", "LRUCache", "parse_csv_line", "top_k_words", "edit_distance", "RateLimiter", "is_valid_ipv4", "flatten"}
	constraints = []string{
		"The input size can be up to 10^5 elements.",
		"Your solution must run in O(n log n) time or better.",
		"Do not use any third-party libraries.",
		"Handle empty input gracefully.",
		"Include type annotations and a docstring.",
		"The function must not modify its arguments.",
		"Raise a clear error for invalid input instead of returning a sentinel value.",
		"Memory use must stay O(1) beyond the output.",
	}
)

func buggyCode(r *rand.Rand, lines int) string {
	var b strings.Builder
	b.WriteString("def process_orders(orders, inventory):\n    \"\"\"Apply orders to the inventory and return the rejected ones.\"\"\"\n    rejected = []\n")
	items := []string{"widget", "gadget", "sprocket", "flange", "gear", "bolt", "washer", "bracket"}
	for i := 0; i < lines; i++ {
		it := items[r.IntN(len(items))]
		switch r.IntN(4) {
		case 0:
			fmt.Fprintf(&b, "    for order in orders:\n        if order['item'] == '%s' and inventory.get('%s', 0) < order['qty']:\n            rejected.append(order)\n", it, it)
		case 1:
			fmt.Fprintf(&b, "    # restock %s when it falls under the threshold\n    if inventory.get('%s', 0) < %d:\n        inventory['%s'] = inventory.get('%s', 0) + %d\n", it, it, 5+r.IntN(20), it, it, 10+r.IntN(90))
		case 2:
			fmt.Fprintf(&b, "    total_%s = sum(o['qty'] for o in orders if o['item'] == '%s')\n    log.debug('total %s ordered: %%d', total_%s)\n", it, it, it, it)
		default:
			fmt.Fprintf(&b, "    for order in orders:\n        if order not in rejected and order['item'] == '%s':\n            inventory['%s'] -= order['qty']\n", it, it)
		}
	}
	b.WriteString("    return rejected\n")
	return b.String()
}

func codeTask(r *rand.Rand, i int) string {
	lang := langs[r.IntN(len(langs))]
	task := fmt.Sprintf(tasks[r.IntN(len(tasks))], names[r.IntN(len(names))])
	var b strings.Builder
	switch k := r.IntN(10); {
	case k < 5: // short task
		fmt.Fprintf(&b, "%s Use %s.", task, lang)
	case k < 8: // medium: task, constraints and examples
		fmt.Fprintf(&b, "You are given the following task. %s\n\nWrite the solution in %s.\n\nConstraints:\n", task, lang)
		for _, c := range r.Perm(len(constraints))[:2+r.IntN(4)] {
			fmt.Fprintf(&b, "- %s\n", constraints[c])
		}
		b.WriteString("\nExamples:\n")
		for e := 0; e < 2+r.IntN(3); e++ {
			fmt.Fprintf(&b, "Input: %v\nOutput: %v\n\n", r.Perm(3+r.IntN(6)), r.IntN(100))
		}
		b.WriteString("Explain the time and space complexity of your solution after the code.")
	default: // long: debug and refactor a sizeable piece of code (about 3-6k characters)
		b.WriteString("The following Python function is used in our warehouse service. Customers report that some orders are applied twice and that the restock logic sometimes runs after orders were already rejected. Find the bugs, explain each one, and rewrite the function so that it is correct, readable and covered by unit tests.\n\n```python\n")
		b.WriteString(buggyCode(r, 25+r.IntN(35)))
		b.WriteString("```\n\nRequirements:\n")
		for _, c := range constraints {
			fmt.Fprintf(&b, "- %s\n", c)
		}
		fmt.Fprintf(&b, "\nAlso port the corrected version to %s and point out any behaviour that differs between the two versions.", lang)
	}
	return b.String()
}

func writeOpenCode(path string) error {
	r := rand.New(rand.NewPCG(2024, 2))
	rows := make([]codeRow, 300)
	for i := range rows {
		h := sha256.Sum256([]byte(fmt.Sprint("opencode-demo-", i)))
		rows[i] = codeRow{ID: hex.EncodeToString(h[:16]), Input: codeTask(r, i)}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := parquet.NewGenericWriter[codeRow](f, parquet.Compression(&parquet.Snappy))
	if _, err := w.Write(rows); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return f.Close()
}
