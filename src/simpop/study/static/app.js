// The study page. Everything shown is set with textContent: chat text is never parsed as HTML.
"use strict";

const PARTICIPANT_KEY = "simpop-study-participant-key";
const state = { token: null, chat: null, maxChars: 1000 };
const $ = (id) => document.getElementById(id);

function notice(text) {
  const box = $("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: body ? { "Content-Type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  let data = {};
  try { data = await response.json(); } catch (e) { data = {}; }
  if (!response.ok) {
    const detail = typeof data.detail === "string" ? data.detail
      : Array.isArray(data.detail) ? data.detail.map((d) => d.msg).join("; ") : response.statusText;
    const error = new Error(detail);
    error.status = response.status;
    throw error;
  }
  return data;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function render(view) {
  state.chat = view.chat;
  state.maxChars = view.max_message_chars || state.maxChars;
  $("study").hidden = false;
  $("instructions").textContent = view.instructions;
  const list = $("messages");
  list.replaceChildren(...view.messages.map((m) => {
    const item = element("li", m.from);
    item.append(element("span", "who", m.from === "you" ? "You" : m.from === "tool" ? "Tool" : "Chat partner"));
    item.append(document.createTextNode(m.text));
    return item;
  }));
  list.scrollTop = list.scrollHeight;
  const yourTurn = view.turn === "you";
  const survey = yourTurn && view.survey;
  $("composer").hidden = view.turn === "done" || Boolean(survey);
  $("text").disabled = !yourTurn;
  $("send").disabled = !yourTurn;
  $("text").maxLength = state.maxChars;
  $("survey").hidden = !survey;
  if (survey) {
    $("survey-question").textContent = view.survey.question;
    $("survey-options").replaceChildren(...view.survey.options.map((option) => {
      const button = element("button", "option", option);
      button.type = "button";
      button.addEventListener("click", () => send(option));
      return button;
    }));
  }
  $("status").textContent = view.turn === "agent" ? "Your chat partner is typing…"
    : view.turn === "done" ? (view.abandoned ? "This chat timed out." : "The chat is over.")
    : view.error ? "Your last message was not accepted: " + view.error : "";
  $("rating").hidden = !(view.turn === "done" && !view.rated && !view.abandoned);
  $("progress").textContent = "Chat " + (view.number + 1) + (state.chats ? " of " + state.chats : "");
  if (view.turn === "agent") setTimeout(poll, 0);
  if (view.turn === "done" && view.abandoned) $("next").hidden = false;
}

async function poll() {
  try { render(await api("GET", "/api/chat/" + encodeURIComponent(state.chat) + "?wait=1")); }
  catch (error) { notice(error.message); }
}

async function join() {
  notice("");
  $("next").hidden = true;
  try {
    const view = await api("POST", "/api/join", {
      token: state.token, key: localStorage.getItem(PARTICIPANT_KEY) || null,
    });
    localStorage.setItem(PARTICIPANT_KEY, view.key);
    state.chats = view.chats;
    render(view);
  } catch (error) {
    $("study").hidden = error.status === 410 || error.status === 403 || $("study").hidden;
    notice(error.message);
  }
}

async function send(text) {
  if (!text.trim()) return;
  $("send").disabled = true;
  $("text").disabled = true;
  try {
    const view = await api("POST", "/api/chat/" + encodeURIComponent(state.chat) + "/message", { text });
    $("text").value = "";
    updateCount();
    notice("");
    render(view);
  } catch (error) {
    notice(error.message);
    $("send").disabled = false;
    $("text").disabled = false;
  }
}

async function rate(event) {
  event.preventDefault();
  const natural = document.querySelector("input[name=naturalness]:checked");
  const again = document.querySelector("input[name=again]:checked");
  if (!natural || !again) { notice("Please answer both questions."); return; }
  try {
    const result = await api("POST", "/api/chat/" + encodeURIComponent(state.chat) + "/rating", {
      naturalness: Number(natural.value), would_talk_again: again.value === "yes",
    });
    $("rating").hidden = true;
    notice("");
    if (result.remaining > 0) { $("next").hidden = false; $("status").textContent = "Thank you!"; }
    else { $("status").textContent = "Thank you! You have finished the study; you can close this page."; }
  } catch (error) { notice(error.message); }
}

function choices(fieldsetId, name, values, labels) {
  const fieldset = $(fieldsetId);
  values.forEach((value, i) => {
    const label = element("label");
    const input = element("input");
    input.type = "radio";
    input.name = name;
    input.value = value;
    label.append(input, document.createTextNode(" " + labels[i]));
    fieldset.append(label);
  });
}

function updateCount() {
  $("count").textContent = $("text").value.length + " / " + state.maxChars;
}

function start() {
  const params = new URLSearchParams(location.search);
  state.token = params.get("token") || sessionStorage.getItem("simpop-study-token");
  if (params.has("token")) {  // keep the token out of the address bar and history
    sessionStorage.setItem("simpop-study-token", state.token);
    history.replaceState(null, "", location.pathname);
  }
  choices("naturalness", "naturalness", ["1", "2", "3", "4", "5"], ["1", "2", "3", "4", "5"]);
  choices("again", "again", ["yes", "no"], ["Yes", "No"]);
  $("composer").addEventListener("submit", (event) => { event.preventDefault(); send($("text").value); });
  $("text").addEventListener("input", updateCount);
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send($("text").value); }
  });
  $("rating").addEventListener("submit", rate);
  $("next-chat").addEventListener("click", join);
  if (!state.token) { notice("This page needs the study link with its token (…/?token=…)."); return; }
  join();
}

document.addEventListener("DOMContentLoaded", start);
