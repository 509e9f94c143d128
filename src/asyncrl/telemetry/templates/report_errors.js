window.__asyncrlErrors=[];
window.addEventListener('error',function(e){window.__asyncrlErrors.push(String(e.message||e));if(document.body){document.body.setAttribute('data-js-errors',String(window.__asyncrlErrors.length));}});
(function(){var ce=console.error;console.error=function(){window.__asyncrlErrors.push(Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};})();
